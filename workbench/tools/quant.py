"""Fake quantization of linear-layer inputs and weights, as TransformerLens hooks.

Everything here simulates low precision in float32 ("fake quantization"): values are
rounded to what a low-precision format could hold, then computed with as usual. The
pieces:

- ``minmax_quantize``: uniform asymmetric min-max quantization per token (per row), with
  a bit width that may differ from token to token.
- Orthonormal transforms along the sequence axis (``haar``, ``dct``, ``wht``) and a
  feature-axis Hadamard rotation (QuaRot-style, ``hadamard_rotation``).
- ``quantize_activations``: rotation -> sequence transform -> per-token mixed precision
  -> inverse transform -> inverse rotation. STaMP is the Haar/DCT/WHT case with the first
  ``high_precision_tokens`` transformed tokens at ``high_bits``; per-token RTN is the
  identity transform with one bit width. ``sink_tokens`` keeps the BOS / attention-sink
  token out of the transform (at ``high_bits``): its activations are orders of magnitude
  larger than the rest, and a transform would spread its range over its whole window.
- ``fp8_quantize``: E4M3 / E5M2 with per-tensor, per-group (FP32 scale per block) or
  two-level microscaling (one FP32 scale per matrix and a power-of-two scale per block).
- ``rtn_weight`` / ``quantized_weights``: round-to-nearest weight quantization.
- Hook factories (``stamp_hooks``, ``rtn_activation_hooks``, ``fp8_hooks``) that quantize
  the activation feeding each linear layer (see ``LINEAR_INPUT_SITES``).

Why a sequence transform can be a hook: the linear layer acts on the feature axis and the
transform L on the sequence axis, so ``L^T · Q(L·X) · W == (L^T · Q(L·X)) · W``. Replacing
the site's activation X by ``X' = L^T Q(L X)`` and then running the unchanged layer is
exactly STaMP's "transform, quantize, GEMM, inverse transform".

Causality: a sequence transform mixes positions, so the quantized input at position t
depends on later tokens (for Haar with ``levels`` levels: on the tokens of its aligned
window of ``2**levels`` positions). Full-sequence perplexity under STaMP is therefore a
prefill number (as the STaMP paper reports), not a causal one; ``workbench.tools.quant_eval``
also reports perplexity at window-end positions only, which is causal for Haar.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

from workbench.errors import WorkbenchError

TRANSFORMS = ("haar", "dct", "wht", "none")
MIN_BITS, MAX_BITS = 1, 16
FP8_FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}
FP8_SCALINGS = ("tensor", "group", "microscale")

# The activation that feeds each linear layer of a TransformerLens block.
LINEAR_INPUT_SITES = {
    "attn_in": "blocks.{L}.ln1.hook_normalized",  # -> W_Q, W_K, W_V
    "attn_out": "blocks.{L}.attn.hook_z",  # -> W_O
    "mlp_in": "blocks.{L}.ln2.hook_normalized",  # -> W_in, W_gate
    "mlp_out": "blocks.{L}.mlp.hook_post",  # -> W_out
}

Hook = tuple[str, Callable[[torch.Tensor, object], torch.Tensor]]


# ----------------------------------------------------------------------------- validation


def check_bits(bits, what: str = "bits") -> None:
    """Raise a one-line error unless every bit width is an integer in [1, 16]."""
    if isinstance(bits, torch.Tensor):
        bad = (bits < MIN_BITS) | (bits > MAX_BITS) | (bits != torch.round(bits.double()))
        if bool(bad.any()):
            bits = bits[bad].flatten()[0].item()
        else:
            return
    if isinstance(bits, bool) or not isinstance(bits, int | float) or not float(bits).is_integer() \
            or not MIN_BITS <= bits <= MAX_BITS:
        raise WorkbenchError(f"{what}={bits} is out of range: use an integer from {MIN_BITS} to {MAX_BITS}.")


def check_transform(transform: str, n: int | None = None, levels: int = 3) -> None:
    """Raise unless the transform is known and fits a sequence of ``n`` tokens."""
    if transform not in TRANSFORMS:
        raise WorkbenchError(f"Unknown transform {transform!r}: choose one of {', '.join(TRANSFORMS)}.")
    if not isinstance(levels, int) or levels < 1:
        raise WorkbenchError(f"levels={levels} is invalid: use an integer >= 1 (3 is the STaMP default).")
    if transform == "wht" and n is not None and (n < 1 or n & (n - 1)):
        raise WorkbenchError(
            f"The Walsh-Hadamard transform needs a power-of-two sequence length, got {n}: "
            "use transform='haar' or 'dct', or a power-of-two block length."
        )


# ----------------------------------------------------------------------------- uniform quantization


def minmax_quantize(x: torch.Tensor, bits, dim: int = -1) -> torch.Tensor:
    """Asymmetric min-max fake quantization of every slice along ``dim``.

    ``bits`` is an int or a tensor that broadcasts against ``x`` with ``dim`` reduced to
    size 1 (e.g. shape ``[n_tokens, 1]`` for per-token widths of ``[..., n_tokens, d]``).
    The error per element is at most half a step, ``(max - min) / (2**bits - 1) / 2``.
    """
    check_bits(bits)
    xf = x.float()
    levels = (2.0 ** torch.as_tensor(bits, dtype=torch.float32, device=x.device)) - 1.0
    lo = xf.amin(dim, keepdim=True)
    hi = xf.amax(dim, keepdim=True)
    step = (hi - lo) / levels
    step = torch.where(step > 0, step, torch.ones_like(step))  # a constant slice is exact
    q = torch.minimum(torch.round((xf - lo) / step).clamp_min(0), levels)
    return (q * step + lo).to(x.dtype)


# ----------------------------------------------------------------------------- sequence transforms

_INV_SQRT2 = 1.0 / math.sqrt(2.0)


def _haar_lengths(n: int, levels: int) -> list[int]:
    """Lengths of the approximation band entering each Haar level (stops at length 1)."""
    lengths, m = [], n
    for _ in range(levels):
        if m < 2:
            break
        lengths.append(m)
        m = (m + 1) // 2
    return lengths


def haar(x: torch.Tensor, levels: int = 3) -> torch.Tensor:
    """Orthonormal multi-level Haar DWT along axis -2, coarse band first.

    Output layout: ``[approx_L, detail_L, ..., detail_1]``, so the smooth (high-energy)
    part of a sequence lands in the first tokens. Any length works: at a level whose
    input has odd length, the last element is passed unchanged into the next
    approximation band (a permutation, so the transform stays an orthonormal n x n map),
    and levels stop once the band has length 1. Each output token depends only on the
    input tokens of one aligned window of ``2**levels`` positions.
    """
    details, a = [], x
    for m in _haar_lengths(x.shape[-2], levels):
        h = m // 2
        even, odd = a[..., 0 : 2 * h : 2, :], a[..., 1 : 2 * h : 2, :]
        details.append((even - odd) * _INV_SQRT2)
        approx = (even + odd) * _INV_SQRT2
        a = torch.cat([approx, a[..., -1:, :]], dim=-2) if m % 2 else approx
    return torch.cat([a, *details[::-1]], dim=-2)


def ihaar(y: torch.Tensor, levels: int = 3) -> torch.Tensor:
    """Inverse of ``haar`` (its transpose)."""
    lengths = _haar_lengths(y.shape[-2], levels)
    m = (lengths[-1] + 1) // 2 if lengths else y.shape[-2]
    a, pos = y[..., :m, :], m
    for m in reversed(lengths):
        h = m // 2
        det, approx = y[..., pos : pos + h, :], a[..., :h, :]
        pos += h
        pairs = torch.stack([(approx + det) * _INV_SQRT2, (approx - det) * _INV_SQRT2], dim=-2)
        out = pairs.reshape(*pairs.shape[:-3], 2 * h, pairs.shape[-1])
        a = torch.cat([out, a[..., h : h + 1, :]], dim=-2) if m % 2 else out
    return a


@functools.lru_cache(maxsize=32)
def _dct_matrix(n: int) -> torch.Tensor:
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    c = torch.cos(math.pi * (i + 0.5) * k / n) * math.sqrt(2.0 / n)
    c[0] /= math.sqrt(2.0)
    return c


def dct(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal DCT-II along axis -2 (low frequencies first); any length, O(n^2 d)."""
    c = _dct_matrix(x.shape[-2]).to(device=x.device, dtype=x.dtype)
    return torch.matmul(c, x)


def idct(y: torch.Tensor) -> torch.Tensor:
    """Inverse of ``dct`` (its transpose)."""
    c = _dct_matrix(y.shape[-2]).to(device=y.device, dtype=y.dtype)
    return torch.matmul(c.T, y)


@functools.lru_cache(maxsize=32)
def sequency_order(n: int) -> torch.Tensor:
    """Natural-order index of the Walsh function with k sign changes, for k = 0..n-1."""
    bits = max(n.bit_length() - 1, 0)
    k = torch.arange(n)
    g = k ^ (k >> 1)
    rev = torch.zeros_like(g)
    for b in range(bits):
        rev |= ((g >> b) & 1) << (bits - 1 - b)
    return rev


def _fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized fast Walsh-Hadamard transform along axis -2 (natural order)."""
    n, d = x.shape[-2], x.shape[-1]
    lead = x.shape[:-2]
    y, h = x, 1
    while h < n:
        y = y.reshape(*lead, n // (2 * h), 2, h, d)
        a, b = y[..., 0, :, :], y[..., 1, :, :]
        y = torch.stack([a + b, a - b], dim=-3)
        h *= 2
    return y.reshape(*lead, n, d)


def wht(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard transform along axis -2 in sequency order (smooth first).

    Needs a power-of-two length.
    """
    n = x.shape[-2]
    check_transform("wht", n)
    return _fwht(x)[..., sequency_order(n).to(x.device), :] / math.sqrt(n)


def iwht(y: torch.Tensor) -> torch.Tensor:
    """Inverse of ``wht``."""
    n = y.shape[-2]
    check_transform("wht", n)
    inv = torch.argsort(sequency_order(n)).to(y.device)
    return _fwht(y[..., inv, :]) / math.sqrt(n)


def sequence_transform(x: torch.Tensor, transform: str = "haar", levels: int = 3) -> torch.Tensor:
    """Apply the named orthonormal transform along the token axis (-2)."""
    check_transform(transform, x.shape[-2], levels)
    if transform == "haar":
        return haar(x, levels)
    if transform == "dct":
        return dct(x)
    if transform == "wht":
        return wht(x)
    return x


def inverse_sequence_transform(y: torch.Tensor, transform: str = "haar", levels: int = 3) -> torch.Tensor:
    """Undo ``sequence_transform``."""
    check_transform(transform, y.shape[-2], levels)
    if transform == "haar":
        return ihaar(y, levels)
    if transform == "dct":
        return idct(y)
    if transform == "wht":
        return iwht(y)
    return y


def transform_matrix(transform: str, n: int, levels: int = 3) -> torch.Tensor:
    """The n x n matrix L of a sequence transform (``sequence_transform(X) == L @ X``), float64."""
    return sequence_transform(torch.eye(n, dtype=torch.float64), transform, levels)


# ----------------------------------------------------------------------------- feature rotation


@functools.lru_cache(maxsize=32)
def _hadamard_parts(d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random signs ``[d]`` and the normalized Sylvester block ``H_b`` of ``hadamard_rotation``."""
    b = d & -d
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < b:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (d,), generator=gen).float() * 2 - 1
    return signs, (h / math.sqrt(b)).float()


def hadamard_rotation(d: int, seed: int = 0) -> torch.Tensor:
    """A random orthogonal Hadamard rotation of the feature axis (QuaRot-style), float32 [d, d].

    ``diag(signs) @ blockdiag(H_b, ..., H_b)`` with ``b`` the largest power of two dividing
    ``d`` (576 -> blocks of 64): it spreads channel outliers within each block. With odd
    ``d`` it degenerates to sign flips. ``Hadamard(seed)`` applies the same map in O(d b).
    """
    signs, h = _hadamard_parts(d, seed)
    return signs[:, None] * torch.block_diag(*([h] * (d // h.shape[0])))


@dataclasses.dataclass(frozen=True)
class Hadamard:
    """The rotation ``hadamard_rotation(d, seed)`` for whatever width ``d`` it meets, applied blockwise."""

    seed: int = 0

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        signs, h = _hadamard_parts(x.shape[-1], self.seed)
        y = (x * signs.to(x.device)).reshape(*x.shape[:-1], -1, h.shape[0]) @ h.to(x.device)
        return y.reshape(x.shape)

    def invert(self, y: torch.Tensor) -> torch.Tensor:
        signs, h = _hadamard_parts(y.shape[-1], self.seed)
        x = (y.reshape(*y.shape[:-1], -1, h.shape[0]) @ h.to(y.device).T).reshape(y.shape)
        return x * signs.to(y.device)


def _rotate(x: torch.Tensor, rotation, inverse: bool = False) -> torch.Tensor:
    if rotation is None:
        return x
    if isinstance(rotation, Hadamard):
        return rotation.invert(x) if inverse else rotation.apply(x)
    r = rotation.to(x.device)
    return x @ (r.T if inverse else r)


# ----------------------------------------------------------------------------- STaMP / RTN


def stamp_bits(n: int, bits: int = 4, high_bits: int = 8, high_precision_tokens: int = 64) -> torch.Tensor:
    """Bit width of each transformed token: ``high_bits`` for the first tokens, ``bits`` after."""
    check_bits(bits)
    check_bits(high_bits, "high_bits")
    if high_precision_tokens < 0:
        raise WorkbenchError(f"high_precision_tokens={high_precision_tokens} must be >= 0.")
    out = torch.full((n,), bits, dtype=torch.int64)
    out[:high_precision_tokens] = high_bits
    return out


def average_bits(n: int, bits: int = 4, high_bits: int = 8, high_precision_tokens: int = 0,
                 sink_tokens: int = 0) -> float:
    """Mean activation bit width over ``n`` tokens (4 + 256/n for STaMP's default)."""
    sink = min(sink_tokens, n)
    hp = min(high_precision_tokens, n - sink)
    return ((sink + hp) * high_bits + (n - sink - hp) * bits) / n


def quantize_activations(
    x: torch.Tensor,
    bits: int = 4,
    transform: str = "none",
    high_precision_tokens: int = 0,
    high_bits: int = 8,
    levels: int = 3,
    rotation: torch.Tensor | Hadamard | None = None,
    sink_tokens: int = 0,
) -> torch.Tensor:
    """Fake-quantize ``x [..., tokens, features]`` per token, optionally STaMP-style.

    ``x' = R^T-rotate(L^T Q_b(L (x R)))`` with L the sequence transform, Q_b per-token
    min-max at per-token widths b (``stamp_bits``) and R an optional feature rotation.
    ``transform="none", high_precision_tokens=0`` is plain per-token RTN. ``rotation`` is an
    orthogonal ``[features, features]`` matrix or a ``Hadamard`` (fast, any width).

    ``sink_tokens`` leading tokens (the BOS / attention sink, whose activations are orders of
    magnitude larger) are kept out of the transform and quantized alone at ``high_bits``;
    otherwise the transform smears their range over their whole window.
    """
    check_bits(bits)
    check_transform(transform, x.shape[-2] - sink_tokens, levels)
    if sink_tokens < 0:
        raise WorkbenchError(f"sink_tokens={sink_tokens} must be >= 0.")
    dtype = x.dtype
    y = _rotate(x.float(), rotation)
    sink, body = y[..., :sink_tokens, :], y[..., sink_tokens:, :]
    body = sequence_transform(body, transform, levels)
    widths = stamp_bits(body.shape[-2], bits, high_bits, high_precision_tokens).to(y.device)
    body = minmax_quantize(body, widths[:, None] if high_precision_tokens else bits)
    body = inverse_sequence_transform(body, transform, levels)
    if sink_tokens:
        body = torch.cat([minmax_quantize(sink, high_bits), body], dim=-2)
    return _rotate(body, rotation, inverse=True).to(dtype)


def stamp_quantize(
    x: torch.Tensor,
    bits: int = 4,
    high_bits: int = 8,
    high_precision_tokens: int = 64,
    transform: str = "haar",
    levels: int = 3,
    rotation: torch.Tensor | Hadamard | None = None,
    sink_tokens: int = 0,
) -> torch.Tensor:
    """STaMP on ``x [..., tokens, features]``: Haar (3 levels), first 64 tokens at 8 bits, rest at 4."""
    return quantize_activations(x, bits, transform, high_precision_tokens, high_bits, levels, rotation, sink_tokens)


# ----------------------------------------------------------------------------- FP8


def _check_fp8(fmt: str, scaling: str = "microscale", block_size: int = 32) -> None:
    if fmt not in FP8_FORMATS:
        raise WorkbenchError(f"Unknown FP8 format {fmt!r}: choose one of {', '.join(FP8_FORMATS)}.")
    if scaling not in FP8_SCALINGS:
        raise WorkbenchError(f"Unknown FP8 scaling {scaling!r}: choose one of {', '.join(FP8_SCALINGS)}.")
    if not isinstance(block_size, int) or block_size < 1:
        raise WorkbenchError(f"block_size={block_size} is invalid: use a positive integer (32 is standard).")


def fp8_round(x: torch.Tensor, fmt: str = "e4m3") -> torch.Tensor:
    """Round to the nearest FP8 value (round-half-even), saturating at the format's max (448 / 57344)."""
    _check_fp8(fmt)
    dtype, fmax = FP8_FORMATS[fmt]
    return x.float().clamp(-fmax, fmax).to(dtype).to(x.dtype)


def _blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """View the last axis as ``[n_blocks, block_size]``, zero-padding a ragged last block."""
    d = x.shape[-1]
    pad = -d % block_size
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], -1, block_size)


def fp8_quantize(
    x: torch.Tensor, fmt: str = "e4m3", scaling: str = "microscale", block_size: int = 32
) -> torch.Tensor:
    """Simulate FP8 storage of ``x [..., tokens, features]`` with a scaling scheme.

    - ``tensor``: one FP32 scale per matrix (amax over the last two axes / FP8 max).
    - ``group``: one FP32 scale per ``block_size`` consecutive features of a token.
    - ``microscale`` (MOSS): the per-matrix FP32 scale, times a power-of-two scale per
      block chosen so the block's amax just fits; small blocks keep their precision
      instead of underflowing, at the cost of an exponent (8 bits) per block.
    """
    _check_fp8(fmt, scaling, block_size)
    fmax = FP8_FORMATS[fmt][1]
    xf = x.float()
    d = xf.shape[-1]
    blocks = _blocks(xf, block_size)  # [..., tokens, n_blocks, block]
    amax_matrix = xf.abs().amax(dim=(-2, -1), keepdim=True)[..., None]  # [..., 1, 1, 1]
    global_scale = torch.where(amax_matrix > 0, amax_matrix / fmax, torch.ones_like(amax_matrix))
    if scaling == "tensor":
        scale = global_scale
    else:
        amax_block = blocks.abs().amax(dim=-1, keepdim=True)
        if scaling == "group":
            scale = torch.where(amax_block > 0, amax_block / fmax, torch.ones_like(amax_block))
        else:
            ratio = (amax_block / (global_scale * fmax)).clamp_min(torch.finfo(torch.float32).tiny)
            scale = global_scale * torch.exp2(torch.ceil(torch.log2(ratio)))
    out = fp8_round(blocks / scale, fmt) * scale
    return out.reshape(*xf.shape[:-1], -1)[..., :d].to(x.dtype)


# ----------------------------------------------------------------------------- weights


def rtn_weight(w: torch.Tensor, bits: int = 4, group_size: int | None = None) -> torch.Tensor:
    """Round-to-nearest min-max quantization of ``w [out, in]`` per output row, or per group of inputs.

    A ragged last group is padded by repeating its last value, which leaves its range unchanged.
    """
    check_bits(bits, "weight bits")
    if group_size is None:
        return minmax_quantize(w, bits)
    if not isinstance(group_size, int) or group_size < 1:
        raise WorkbenchError(f"group_size={group_size} is invalid: use a positive integer or None (per channel).")
    n_in = w.shape[-1]
    pad = -n_in % group_size
    wp = torch.cat([w, w[..., -1:].expand(*w.shape[:-1], pad)], dim=-1) if pad else w
    q = minmax_quantize(wp.reshape(*w.shape[:-1], -1, group_size), bits)
    return q.reshape(*w.shape[:-1], -1)[..., :n_in]


# TransformerLens weight name -> its input axes (the rest are output axes).
_WEIGHT_INPUT_AXES = {
    "attn.W_Q": (1,),
    "attn.W_K": (1,),
    "attn._W_K": (1,),
    "attn.W_V": (1,),
    "attn._W_V": (1,),
    "attn.W_O": (0, 1),
    "mlp.W_in": (0,),
    "mlp.W_gate": (0,),
    "mlp.W_out": (0,),
}


def _quantize_param(w: torch.Tensor, input_axes: Sequence[int], bits: int, group_size: int | None) -> torch.Tensor:
    out_axes = [a for a in range(w.ndim) if a not in input_axes]
    perm = out_axes + list(input_axes)
    wp = w.permute(perm)
    n_out = math.prod(wp.shape[: len(out_axes)])
    q = rtn_weight(wp.reshape(n_out, -1), bits, group_size).reshape(wp.shape)
    return q.permute(torch.argsort(torch.tensor(perm)).tolist())


def _existing_layers(model, layers: Iterable[int] | None) -> list[int]:
    n = model.cfg.n_layers
    chosen = list(range(n)) if layers is None else sorted(set(layers))
    bad = [L for L in chosen if not 0 <= L < n]
    if bad:
        raise WorkbenchError(f"Layers {bad} do not exist: the model has layers 0..{n - 1}.")
    return chosen


@contextlib.contextmanager
def quantized_weights(
    model, bits: int = 4, group_size: int | None = 128, layers: Iterable[int] | None = None
) -> Iterator[None]:
    """Temporarily replace the attention and MLP weights of ``layers`` by their RTN versions.

    Embeddings and the unembedding stay in float, as is usual. Weights are restored on exit.
    """
    from workbench.models.loading import edited_in_place, stamp_weights

    check_bits(bits, "weight bits")
    saved: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    params = dict(model.named_parameters())
    as_loaded = not edited_in_place(model)
    try:
        with torch.no_grad():
            for L in _existing_layers(model, layers):
                for suffix, axes in _WEIGHT_INPUT_AXES.items():
                    p = params.get(f"blocks.{L}.{suffix}")
                    if p is None:
                        continue
                    saved.append((p, p.detach().clone()))
                    p.copy_(_quantize_param(p.detach(), axes, bits, group_size))
        yield
    finally:
        with torch.no_grad():
            for p, original in saved:
                p.copy_(original)
        if as_loaded:  # restored exactly: the recorded hash names these weights again
            stamp_weights(model)


# ----------------------------------------------------------------------------- hooks


def _norm_weight(model, name: str) -> torch.Tensor | None:
    """The RMS/LayerNorm gain applied after ``hook_normalized`` (None when folded into the weights)."""
    module = model.get_submodule(name.rsplit(".", 1)[0])
    return getattr(module, "w", None)


def activation_hooks(
    model,
    quantizer: Callable[[torch.Tensor], torch.Tensor],
    layers: Iterable[int] | None = None,
    sites: Sequence[str] = tuple(LINEAR_INPUT_SITES),
) -> list[Hook]:
    """Hooks that replace each linear layer's input ``X [batch, tokens, features]`` by ``quantizer(X)``.

    ``hook_z`` is viewed as ``[batch, tokens, heads*d_head]``, the input of W_O. After an
    unfolded norm (``ln.w`` present) the layer's real input is ``normalized * w``, so that
    product is quantized and divided back: the layer then sees exactly ``quantizer(normalized * w)``.
    """
    unknown = [s for s in sites if s not in LINEAR_INPUT_SITES]
    if unknown:
        raise WorkbenchError(f"Unknown sites {unknown}: choose from {', '.join(LINEAR_INPUT_SITES)}.")
    pairs: list[Hook] = []
    for L in _existing_layers(model, layers):
        for site in sites:
            name = LINEAR_INPUT_SITES[site].format(L=L)
            gain = _norm_weight(model, name) if site in ("attn_in", "mlp_in") else None
            pairs.append((name, _make_hook(quantizer, gain)))
    return pairs


def _make_hook(quantizer, gain: torch.Tensor | None):
    def hook(activation: torch.Tensor, hook) -> torch.Tensor:
        shape = activation.shape
        x = activation.reshape(*shape[:2], -1)
        if gain is None:
            return quantizer(x).reshape(shape)
        g = gain.detach().to(x.dtype)
        safe = torch.where(g != 0, g, torch.ones_like(g))
        q = quantizer(x * g) / safe
        return torch.where(g != 0, q, x).reshape(shape)

    return hook


def stamp_hooks(
    model,
    bits: int = 4,
    transform: str = "haar",
    high_precision_tokens: int = 64,
    high_bits: int = 8,
    levels: int = 3,
    rotate: bool = False,
    seed: int = 0,
    layers: Iterable[int] | None = None,
    sites: Sequence[str] = tuple(LINEAR_INPUT_SITES),
    sink_tokens: int = 0,
) -> list[Hook]:
    """STaMP on every linear layer's input: ``X' = L^T Q(L X)`` at the site, then the unchanged layer.

    Prefill semantics: during one-token decode steps the transform is the identity and the
    token gets ``high_bits``. Non-causal within each transform window (module docstring).
    ``sink_tokens=1`` keeps the BOS token out of the transform at ``high_bits``: on SmolLM2
    this is what makes STaMP help (its BOS activations dwarf every other token's).
    """
    check_bits(bits)
    check_bits(high_bits, "high_bits")
    check_transform(transform, None, levels)
    if sink_tokens < 0:
        raise WorkbenchError(f"sink_tokens={sink_tokens} must be >= 0.")
    rotation = Hadamard(seed) if rotate else None

    def quantizer(x):
        return quantize_activations(x, bits, transform, high_precision_tokens, high_bits, levels, rotation,
                                    sink_tokens)

    return activation_hooks(model, quantizer, layers, sites)


def rtn_activation_hooks(
    model,
    bits: int = 8,
    rotate: bool = False,
    seed: int = 0,
    layers: Iterable[int] | None = None,
    sites: Sequence[str] = tuple(LINEAR_INPUT_SITES),
    sink_tokens: int = 0,
    sink_bits: int = 8,
) -> list[Hook]:
    """Per-token min-max RTN of every linear layer's input (causal: each token on its own)."""
    return stamp_hooks(model, bits, "none", 0, sink_bits, 3, rotate, seed, layers, sites, sink_tokens)


def fp8_hooks(
    model,
    fmt: str = "e4m3",
    scaling: str = "microscale",
    block_size: int = 32,
    layers: Iterable[int] | None = None,
    sites: Sequence[str] = tuple(LINEAR_INPUT_SITES),
) -> list[Hook]:
    """FP8 simulation of every linear layer's input.

    ``tensor`` and ``microscale`` take their FP32 scale from the whole sequence (a mild,
    scale-only dependence on later tokens); ``group`` is causal.
    """
    _check_fp8(fmt, scaling, block_size)
    return activation_hooks(model, lambda x: fp8_quantize(x, fmt, scaling, block_size), layers, sites)
