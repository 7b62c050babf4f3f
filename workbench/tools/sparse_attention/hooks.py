"""The selector as hooks on a KV-cached TransformerLens model, and the per-layer quality it reaches.

The hook on ``blocks.{L}.attn.hook_attn_scores`` sets the scores of unselected keys to -inf at
every single-token decode step, so the model runs exactly as if only the selected keys and values
had been loaded; the prefill stays dense. Scores are read from the dense scores TransformerLens
computes anyway, which is why speed is measured on plain tensors instead (``workbench.kernels.attention``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from workbench.tools.sparse_attention.selectors import Selector


class StepMetrics:
    """Per-layer running sums of fraction loaded, attention-mass recall and output error."""

    def __init__(self, n_layers: int):
        self.sums = torch.zeros(n_layers, 3, dtype=torch.float64)
        self.counts = torch.zeros(n_layers, dtype=torch.float64)

    def add(self, layer: int, loaded: float, recall: float, out_err: float) -> None:
        self.sums[layer] += torch.tensor([loaded, recall, out_err], dtype=torch.float64)
        self.counts[layer] += 1

    def per_layer(self) -> dict[str, list[float]]:
        mean = self.sums / self.counts.clamp_min(1)[:, None]
        return {k: mean[:, i].tolist() for i, k in enumerate(("loaded", "recall", "out_err"))}


def layer_types(model) -> list[str]:
    """``"local"`` (a sliding-window layer, e.g. 15 of Gemma 3's 18) or ``"global"`` per layer."""
    return ["local" if getattr(block.attn, "attn_type", "global") == "local" else "global" for block in model.blocks]


def group_mass(pattern: torch.Tensor, n_kv: int) -> torch.Tensor:
    """``[b, heads, q, n]`` attention pattern -> mass per key per KV head, ``[b, kv, n]``."""
    b, h, _, n = pattern.shape
    return pattern.sum(2).reshape(b, n_kv, h // n_kv, n).sum(2)


def sparse_attention_hooks(model, selector: Selector, cache, n_prefill: int, metrics: StepMetrics | None = None,
                           layers: Sequence[int] | None = None) -> list:
    """Hooks that apply ``selector`` at every single-token decode step (prefill stays dense).

    ``cache`` is the model's KV cache (its values give the output-error metric); keys at
    positions ``>= n_prefill`` were generated during decoding and are always attended.
    Sliding-window layers (``layer_types``) attend their window densely, as the model does: only
    global layers are sparsified, and a window layer's "loaded" is its window's share of the cache.
    """
    stash: dict[tuple[int, str], torch.Tensor] = {}
    n_kv = model.cfg.n_key_value_heads or model.cfg.n_heads
    windows = [model.cfg.window_size if kind == "local" else None for kind in layer_types(model)]
    pairs = []
    for L in range(model.cfg.n_layers) if layers is None else layers:
        def keep(x, hook, L=L, what=""):
            stash[(L, what)] = x
            return x

        def on_scores(scores, hook, L=L, window=windows[L]):
            if scores.shape[2] != 1:
                return scores
            s = scores[:, :, 0]
            if window is not None:  # the model's own window, dense
                n = s.shape[-1]
                in_window = torch.arange(n, device=s.device) >= n - window
                mask = in_window.expand(s.shape[0], n_kv, n)
            else:
                mask = selector.select(L, s, stash[(L, "q")][:, -1], stash[(L, "k")], n_prefill)  # [b, kv, n]
            mask_h = mask.repeat_interleave(s.shape[1] // mask.shape[1], dim=1)
            if metrics is not None:
                _record(metrics, L, s, mask, mask_h, cache[L].past_values)
            return scores.masked_fill(~mask_h[:, :, None, :], float("-inf"))

        def on_pattern(pattern, hook, L=L):
            if pattern.shape[2] == 1:
                selector.observe(L, group_mass(pattern, n_kv))
            return pattern

        pairs += [
            (f"blocks.{L}.attn.hook_rot_q", lambda x, hook, L=L: keep(x, hook, L, "q")),
            (f"blocks.{L}.attn.hook_rot_k", lambda x, hook, L=L: keep(x, hook, L, "k")),
            (f"blocks.{L}.attn.hook_attn_scores", on_scores),
            (f"blocks.{L}.attn.hook_pattern", on_pattern),
        ]
    return pairs


def _record(metrics: StepMetrics, layer: int, s, mask, mask_h, values) -> None:
    full = s.float().softmax(-1)  # [b, h, n]
    sparse = s.float().masked_fill(~mask_h, float("-inf")).softmax(-1)
    h, kv = s.shape[1], values.shape[2]
    v = values.float().repeat_interleave(h // kv, dim=2)  # [b, n, h, d]
    z_full = torch.einsum("bhn,bnhd->bhd", full, v)
    z_sparse = torch.einsum("bhn,bnhd->bhd", sparse, v)
    err = ((z_sparse - z_full).norm(dim=-1) / z_full.norm(dim=-1).clamp_min(1e-12)).mean().item()
    recall = (full * mask_h).sum(-1).mean().item()
    metrics.add(layer, mask.float().mean().item(), recall, err)
