"""Measure a quantization setting: perplexity on held-out text and drift of the residual stream.

A ``QuantSetting`` names one configuration (weights, activations, transform, FP8 scaling);
``apply_setting`` turns it into hooks plus a weight context on the shared model, so the same
model object serves every setting and every analysis.

How perplexity is reported (causal honesty). ``ppl`` uses every next-token prediction of
a full-sequence forward pass: the prefill number STaMP reports. Under a sequence transform
it is *not* causal (position t's quantized input depends on later tokens of its transform
window). ``ppl_window_end`` uses only the predictions made at the last position of each
aligned window of ``2**levels`` tokens (positions 7, 15, ... for 3 Haar levels; shifted by
the sink tokens, which are quantized alone). A Haar
window never reaches past its end, so at those positions nothing from the future leaks in
and the number is causal; the float model is scored on the same positions for comparison.
Settings whose values mix positions across a whole sequence (DCT, WHT) get no causal
number (NaN). FP8 per-tensor / microscale scales come from the whole sequence, which only
leaks the sequence's amax; they are flagged ``mixes="scale"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator, Sequence

import torch

from workbench.errors import WorkbenchError
from workbench.tools import quant
from workbench.tools.drift import (
    DriftMeter,
    relative_l2,
    site_activations,
    token_rows,
)


@dataclasses.dataclass(frozen=True)
class QuantSetting:
    """One quantization configuration; ``act`` is ``none`` | ``int`` | ``fp8``."""

    name: str
    act: str = "none"
    act_bits: int = 8
    transform: str = "none"
    high_precision_tokens: int = 0
    high_bits: int = 8
    levels: int = 3
    rotate: bool = False
    fp8_format: str = "e4m3"
    fp8_scaling: str = "microscale"
    fp8_block: int = 32
    sink_tokens: int = 0
    weight_bits: int | None = None
    weight_group: int | None = 128

    def mixes(self) -> str:
        """Which part of a token's quantized input depends on other positions: no | window | sequence | scale."""
        if self.act == "int" and self.transform != "none":
            return "window" if self.transform == "haar" else "sequence"
        if self.act == "fp8" and self.fp8_scaling != "group":
            return "scale"
        return "no"

    def average_act_bits(self, n_tokens: int) -> float:
        """Mean activation bits per value (FP8: 8, plus the per-block exponent when microscaled)."""
        if self.act == "int":
            return quant.average_bits(n_tokens, self.act_bits, self.high_bits, self.high_precision_tokens,
                                      self.sink_tokens)
        if self.act == "fp8":
            return 8 + (8 / self.fp8_block if self.fp8_scaling == "microscale" else 0)
        return 32.0


def _int(name: str, bits: int = 4, stamp: str | None = None, rot: bool = False, sink: bool = False,
         mp: bool = False, **kw) -> QuantSetting:
    """A preset: ``stamp`` names the transform; ``mp`` = STaMP's bit split without a transform."""
    return QuantSetting(name, act="int", act_bits=bits, transform=stamp or "none",
                        high_precision_tokens=64 if (stamp or mp) else 0, rotate=rot, sink_tokens=int(sink), **kw)


# Named presets; a study config may list these names or full dicts. "+sink": the BOS token is
# quantized alone at 8 bits and kept out of the transform.
PRESETS = {
    s.name: s
    for s in [
        QuantSetting("float"),
        _int("A8", 8),
        _int("A4"),
        _int("A4+sink", sink=True),
        _int("A4-mp", mp=True),
        _int("A4-mp+sink", mp=True, sink=True),
        _int("A4+STaMP", stamp="haar"),
        _int("A4+STaMP+sink", stamp="haar", sink=True),
        _int("A4+STaMP-dct+sink", stamp="dct", sink=True),
        _int("A4+rot", rot=True),
        _int("A4+rot+sink", rot=True, sink=True),
        _int("A4+rot+STaMP", stamp="haar", rot=True),
        _int("A4+rot+STaMP+sink", stamp="haar", rot=True, sink=True),
        _int("A4+rot+STaMP-dct+sink", stamp="dct", rot=True, sink=True),
        _int("A4+STaMP-wht", stamp="wht"),
        _int("W4A8", 8, weight_bits=4),
        _int("W4A4+rot+sink", rot=True, sink=True, weight_bits=4),
        _int("W4A4+rot+STaMP+sink", stamp="haar", rot=True, sink=True, weight_bits=4),
        QuantSetting("FP8-e4m3-tensor", act="fp8", fp8_scaling="tensor"),
        QuantSetting("FP8-e4m3-group", act="fp8", fp8_scaling="group"),
        QuantSetting("FP8-e4m3-mx", act="fp8", fp8_scaling="microscale"),
        QuantSetting("FP8-e5m2-tensor", act="fp8", fp8_format="e5m2", fp8_scaling="tensor"),
        QuantSetting("FP8-e5m2-mx", act="fp8", fp8_format="e5m2", fp8_scaling="microscale"),
    ]
}


def resolve_setting(spec: str | dict | QuantSetting) -> QuantSetting:
    """A preset name, a dict of ``QuantSetting`` fields, or a setting itself."""
    if isinstance(spec, QuantSetting):
        return spec
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise WorkbenchError(f"Unknown quantization setting {spec!r}: choose from {', '.join(PRESETS)}.")
        return PRESETS[spec]
    fields = {f.name for f in dataclasses.fields(QuantSetting)}
    unknown = set(spec) - fields
    if unknown or "name" not in spec:
        raise WorkbenchError(f"Bad setting {spec}: needs 'name' and only fields from {', '.join(sorted(fields))}.")
    return QuantSetting(**spec)


def setting_hooks(model, setting: QuantSetting) -> list[quant.Hook]:
    """The activation hooks of a setting (none for float activations)."""
    if setting.act == "int":
        return quant.stamp_hooks(model, setting.act_bits, setting.transform, setting.high_precision_tokens,
                                 setting.high_bits, setting.levels, setting.rotate, sink_tokens=setting.sink_tokens)
    if setting.act == "fp8":
        return quant.fp8_hooks(model, setting.fp8_format, setting.fp8_scaling, setting.fp8_block)
    if setting.act != "none":
        raise WorkbenchError(f"Unknown activation mode {setting.act!r}: use 'none', 'int' or 'fp8'.")
    return []


@contextlib.contextmanager
def apply_setting(model, setting: str | dict | QuantSetting) -> Iterator[QuantSetting]:
    """Run the model quantized as ``setting`` inside the block; hooks and weights are restored after."""
    setting = resolve_setting(setting)
    hooks = setting_hooks(model, setting)
    with contextlib.ExitStack() as stack:
        if setting.weight_bits is not None:
            stack.enter_context(quant.quantized_weights(model, setting.weight_bits, setting.weight_group))
        stack.enter_context(model.hooks(fwd_hooks=hooks))
        yield setting


def token_nll(model, token_blocks: torch.Tensor, hooks: Sequence[quant.Hook] = (), batch_size: int = 2,
              progress: bool = True, desc: str = "nll") -> torch.Tensor:
    """Next-token negative log-likelihood at every position, ``[n_blocks, block_len - 1]``."""
    from workbench.progress import progress_bar

    if token_blocks.ndim != 2 or token_blocks.shape[1] < 2:
        raise WorkbenchError("token_blocks must be a [n_blocks, block_len >= 2] tensor of token ids.")
    device = next(model.parameters()).device
    out = []
    with model.hooks(fwd_hooks=list(hooks)), torch.inference_mode():
        for start in progress_bar(range(0, len(token_blocks), batch_size), desc=desc, disable=not progress, leave=False):
            batch = token_blocks[start : start + batch_size].to(device)
            logits = model(batch, return_type="logits")[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="none"
            )
            out.append(nll.reshape(batch.shape[0], -1).cpu())
    return torch.cat(out)


def perplexity(model, token_blocks: torch.Tensor, hooks: Sequence[quant.Hook] = (), batch_size: int = 2,
               progress: bool = True) -> float:
    """exp(mean next-token NLL) over all positions of the blocks (full-sequence prefill)."""
    return math.exp(token_nll(model, token_blocks, hooks, batch_size, progress).mean().item())


def window_end_positions(block_len: int, levels: int = 3, sink_tokens: int = 0) -> torch.Tensor:
    """Prediction positions that end an aligned window of ``2**levels`` tokens (causal under Haar).

    Sink tokens are quantized alone, so they count as ends; the windows start after them.
    """
    pos = torch.arange(block_len - 1)
    return pos[(pos < sink_tokens) | ((pos - sink_tokens + 1) % (2**levels) == 0)]


def resid_drift(model, tokens: torch.Tensor, setting: str | dict | QuantSetting,
                start: int = 0) -> list[float]:
    """Relative L2 error of ``blocks.{L}.hook_resid_post`` under ``setting`` vs float, per layer.

    Over positions ``>= start``: with ``start=0`` the BOS / sink token, whose residual norm
    dwarfs the others, dominates the number; ``start=1`` measures the ordinary tokens.
    """
    return resid_drifts(model, tokens, setting, (start,))[start]


def resid_drifts(model, tokens: torch.Tensor, setting: str | dict | QuantSetting,
                 starts: Sequence[int] = (0, 1)) -> dict[int, list[float]]:
    """``resid_drift`` for several start positions from one pair of forward passes."""
    names = [f"blocks.{L}.hook_resid_post" for L in range(model.cfg.n_layers)]
    ref = site_activations(model, tokens, names)
    with apply_setting(model, setting):
        got = site_activations(model, tokens, names)
    return {s: relative_l2(ref, got, names, s) for s in starts}


def compare_settings(model, token_blocks: torch.Tensor, settings: Sequence[str | dict | QuantSetting],
                     batch_size: int = 2, drift_blocks: int = 2, progress: bool = True,
                     topology_layers: Sequence[int] | None = None, topology_k: int = 128, sae=None,
                     seed: int = 0, cache=None) -> list[dict]:
    """One row per setting: perplexities (prefill and window-end), bits, causality flag, drift, time.

    ``drift_*`` is the relative L2 error of the residual stream over all positions (dominated
    by the BOS token's huge norm); ``drift_tokens_*`` leaves position 0 out. With
    ``topology_layers`` and/or an ``sae``, the same drift tokens also give the drift of the
    per-layer persistent homology and of the SAE's reconstruction (``workbench.tools.drift``).

    The float model is always evaluated first (as ``float``) and gives the reference columns.

    ``cache``: a folder where each finished setting's row and per-token losses are kept (``settings_cache``),
    so an interrupted evaluation resumes at its first unfinished setting (a full profile took 36-46 min per
    model on 2 cores); a cached row keeps the ``seconds`` of the run that computed it.
    """
    resolved = [resolve_setting(s) for s in settings]
    for s in resolved:  # validate everything before the long loop starts
        setting_hooks(model, s)
    block_len = token_blocks.shape[1]
    ordered = [PRESETS["float"]] + [s for s in resolved if s.name != "float"]
    drift_batch = token_blocks[:drift_blocks]
    meter = DriftMeter(model, topology_layers, topology_k, sae, seed)
    names = [f"blocks.{L}.hook_resid_post" for L in range(model.cfg.n_layers)]
    sites = list(dict.fromkeys(names + meter.sites))
    kept = settings_cache(cache, model, token_blocks, batch_size, drift_blocks, meter)
    rows, float_nll, ref = [], None, None
    for s in ordered:
        held = kept.get(s.name, dataclasses.asdict(s))
        if held is not None:  # finished by an earlier run under the same inputs
            float_nll = torch.tensor(held["nll"]) if float_nll is None else float_nll
            rows.append(held["row"])
            continue
        if ref is None:  # one float forward on the drift tokens serves every setting's L2, topology and SAE drift;
            # made only once a setting needs computing, so a run that is all cached runs no model
            ref = site_activations(model, drift_batch, sites)
            if meter.sites:
                meter.set_reference(token_rows(ref, meter.sites))
        t0 = time.perf_counter()
        with apply_setting(model, s):
            nll = token_nll(model, token_blocks, batch_size=batch_size, progress=progress, desc=s.name)
        seconds = time.perf_counter() - t0
        float_nll = nll if float_nll is None else float_nll
        if s.name == "float":
            got, drift, drift_tokens = ref, [], []
        else:
            with apply_setting(model, s):
                got = site_activations(model, drift_batch, sites)
            drift, drift_tokens = relative_l2(ref, got, names, 0), relative_l2(ref, got, names, 1)
        ends = window_end_positions(block_len, s.levels, s.sink_tokens)
        causal = s.mixes() != "sequence"
        rows.append({
            "setting": s.name,
            "weight_bits": s.weight_bits or 32,
            "act_bits": round(s.average_act_bits(block_len), 3),
            "mixes": s.mixes(),
            "ppl": math.exp(nll.mean().item()),
            "ppl_window_end": math.exp(nll[:, ends].mean().item()) if causal else float("nan"),
            "float_ppl_window_end": math.exp(float_nll[:, ends].mean().item()),
            "delta_ppl": math.exp(nll.mean().item()) - math.exp(float_nll.mean().item()),
            "drift_mean": sum(drift) / len(drift) if drift else 0.0,
            "drift_last": drift[-1] if drift else 0.0,
            "drift_tokens_mean": sum(drift_tokens) / len(drift_tokens) if drift_tokens else 0.0,
            "drift_tokens_last": drift_tokens[-1] if drift_tokens else 0.0,
            "drift_per_layer": drift,
            "drift_tokens_per_layer": drift_tokens,
            "seconds": seconds,
            "n_tokens": int(token_blocks.numel()),
        })
        if meter.sites:
            rows[-1] |= meter.measure(token_rows(got, meter.sites))
        kept.put(s.name, dataclasses.asdict(s), {"row": rows[-1], "nll": nll.float().cpu().tolist()})
    return rows


def settings_cache(cache, model, token_blocks: torch.Tensor, batch_size: int, drift_blocks: int, meter: DriftMeter):
    """The ``ItemCache`` in ``cache`` of one evaluation's finished settings, keyed by everything a row depends on:
    the model (weights, dtype, attention kernel), the tokens, the batch and drift settings, the drift meter (layers,
    k, seed, SAE), the workbench's code and the package versions (``report.versions``, as study jobs are keyed),
    so no row computed under other inputs is ever served."""
    from workbench.io import ItemCache
    from workbench.models.loading import cache_identity
    from workbench.report import versions

    return ItemCache.keyed(cache, ["quant_eval", cache_identity(model), batch_size, drift_blocks, meter.fingerprint(),
                                   versions()], token_blocks.cpu().numpy())


QUANT_COLUMNS = ("setting", "weight_bits", "act_bits", "mixes", "ppl", "ppl_window_end", "float_ppl_window_end",
                 "drift_tokens_mean", "drift_tokens_last", "drift_last")


def quant_figure(rows: Sequence[dict], title: str = "Quantization"):
    """Plotly figure: perplexity per setting (left) and residual drift per layer (right)."""
    from plotly.subplots import make_subplots

    from workbench.report import readable_layout, setting_colours

    fig = make_subplots(rows=1, cols=2, subplot_titles=("perplexity (held-out text)",
                                                        "relative L2 drift of resid_post (positions >= 1)"))
    names = [r["setting"] for r in rows]
    fig.add_bar(x=names, y=[r["ppl"] for r in rows], name="prefill ppl", row=1, col=1)
    fig.add_bar(x=names, y=[r["ppl_window_end"] for r in rows], name="window-end ppl (causal)", row=1, col=1)
    colours = setting_colours(names)
    for r in rows:
        if r["drift_tokens_per_layer"]:
            fig.add_scatter(y=r["drift_tokens_per_layer"], mode="lines", name=r["setting"], row=1, col=2,
                            line={"color": colours[r["setting"]]})
    fig.update_xaxes(title_text="layer", row=1, col=2)
    fig.update_yaxes(type="log", row=1, col=2)
    return readable_layout(fig, title, height=560)

