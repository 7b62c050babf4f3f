"""Sparse attention for decoding: which cached tokens each KV head reads, as hooks on a KV-cached model.

A *selector* looks at one decode step of one layer and returns a boolean mask
``[batch, kv_heads, keys]``; the hook on ``blocks.{L}.attn.hook_attn_scores`` sets the scores
of unselected keys to -inf, so the model runs exactly as if only the selected keys and
values had been loaded. Grouped-query heads share one selection (it is the KV head's data
that is loaded), and tokens generated after the prefill are always attended.

Selectors (``make_selector``):
- ``full``: dense attention (the reference).
- ``topp``: oracle cumulative mass -- per query head the smallest set of keys whose exact
  softmax mass reaches P, union over the group.
- ``tactic``: the Tactic approximation of ``topp`` without scoring every key: k-means of
  each head's prefill keys (~16 keys per cluster, 10 iterations), clusters ranked by
  query·centroid, keys taken in that order (at least the top ``exact_frac``) until their
  exact mass reaches P of the total, where the mass of the keys not taken is estimated by
  an ``a/x + b`` curve through the exp-scores of small samples near the 10 % and 60 % ranks
  (bridged linearly to the exactly scored head, see ``Tactic.cutoff``). Keys are clustered once at the
  first decode step (Tactic re-clusters every 2048 steps; decodes here are shorter).
- ``topk``: oracle top-k at a fixed budget (group-mean attention probability).
- ``quest``: Quest page bounds -- pages of 16 keys, channel-wise min/max, pages ranked by
  the upper bound of q·k, top pages up to the budget.
- ``streaming``: StreamingLLM, 4 sink tokens plus the most recent keys.
- ``h2o``: H2O heavy hitters, the keys with the largest accumulated attention (from the
  prefill and every decode step so far) plus a recent window; evicted keys never return.

Scores are read from the dense scores TransformerLens computes anyway; a selector only
reads the entries its method would have computed, so the quality numbers are those of the
method. Speed is measured separately on plain tensors (``decode_attention``,
``tactic_decode_attention`` in ``workbench.kernels.attention``, re-exported here) because the hooked
model always computes dense scores.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch

from workbench.errors import WorkbenchError
from workbench.kernels.attention import (  # noqa: F401  (re-exported: callers import them from here)
    TailFit,
    cluster_members,
    decode_attention,
    kmeans,
    sparse_decode_attention,
    tactic_decode_attention,
)
from workbench.tools.decoding import decode_loop, new_cache

SELECTORS = ("full", "topp", "tactic", "topk", "quest", "streaming", "h2o")


def _check_p(p: float) -> None:
    if not (isinstance(p, int | float) and 0 < p <= 1):
        raise WorkbenchError(f"P={p} is outside (0, 1]: the attention mass to keep must be in (0, 1] (0.9 is usual).")


def check_positive(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise WorkbenchError(f"{name}={value} is invalid: use a positive integer.")


def group_union(mask: torch.Tensor, n_kv: int) -> torch.Tensor:
    """``[b, heads, n]`` per-query-head selections -> ``[b, kv_heads, n]`` (a key is loaded if any head wants it)."""
    b, h, n = mask.shape
    return mask.reshape(b, n_kv, h // n_kv, n).any(2)


def top_p_mask(probs: torch.Tensor, p: float) -> torch.Tensor:
    """Smallest set of keys (per row of ``probs [..., n]``) whose probability mass reaches ``p``."""
    sorted_p, order = probs.sort(-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p
    keep_sorted = before < p * sorted_p.sum(-1, keepdim=True)
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


class Selector:
    """Chooses the keys each KV head reads at a decode step. Holds per-layer state between steps."""

    def reset(self) -> None:
        """Forget per-sequence state (call before a new sequence)."""

    def observe(self, layer: int, mass: torch.Tensor) -> None:
        """See the attention mass ``[b, kv_heads, keys]`` each key received (summed over the group's heads and queries)."""

    def select(self, layer: int, scores, q, keys, n_prefill: int) -> torch.Tensor:
        """``scores [b, h, n]`` (scaled q·k), ``q [b, h, d]``, ``keys [b, n, kv, d]`` -> mask ``[b, kv, n]``."""
        raise NotImplementedError


def _with_new_tokens(mask_prefill: torch.Tensor, n: int) -> torch.Tensor:
    """Extend a ``[b, kv, n_prefill]`` mask with the always-attended tokens generated since."""
    b, kv, m = mask_prefill.shape
    return torch.cat([mask_prefill, mask_prefill.new_ones(b, kv, n - m)], dim=-1)


class Full(Selector):
    def select(self, layer, scores, q, keys, n_prefill):
        return torch.ones(scores.shape[0], keys.shape[2], scores.shape[-1], dtype=torch.bool, device=scores.device)


class TopP(Selector):
    """Oracle cumulative-mass selection (exact scores)."""

    def __init__(self, p: float = 0.9):
        _check_p(p)
        self.p = p

    def select(self, layer, scores, q, keys, n_prefill):
        return group_union(top_p_mask(scores.softmax(-1), self.p), keys.shape[2])


class TopK(Selector):
    """Oracle top-k keys by group-mean attention probability, at a fixed budget."""

    def __init__(self, budget: int = 256):
        check_positive("budget", budget)
        self.budget = budget

    def select(self, layer, scores, q, keys, n_prefill):
        b, h, n = scores.shape
        kv = keys.shape[2]
        probs = scores.softmax(-1).reshape(b, kv, h // kv, n).mean(2)
        idx = probs.topk(min(self.budget, n), dim=-1).indices
        return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, idx, True)


class StreamingLLM(Selector):
    """Attention sinks plus a recent window, ``budget`` keys in all."""

    def __init__(self, budget: int = 256, sinks: int = 4):
        check_positive("budget", budget)
        self.budget, self.sinks = budget, sinks

    def select(self, layer, scores, q, keys, n_prefill):
        b, _, n = scores.shape
        pos = torch.arange(n, device=scores.device)
        keep = (pos < self.sinks) | (pos >= n - max(self.budget - self.sinks, 0))
        return keep.expand(b, keys.shape[2], n).clone()


class Quest(Selector):
    """Quest: per page of ``page`` prefill keys, channel-wise min/max; pages ranked by the q·k upper bound."""

    def __init__(self, budget: int = 256, page: int = 16):
        check_positive("budget", budget)
        check_positive("page", page)
        self.budget, self.page = budget, page
        self.pages: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def reset(self):
        self.pages.clear()

    def select(self, layer, scores, q, keys, n_prefill):
        b, h, n = scores.shape
        kv, d = keys.shape[2], keys.shape[3]
        if layer not in self.pages:
            k = keys[:, :n_prefill].transpose(1, 2)  # [b, kv, n_prefill, d]
            pad = -n_prefill % self.page
            lo = torch.nn.functional.pad(k, (0, 0, 0, pad), value=float("inf")).reshape(b, kv, -1, self.page, d)
            hi = torch.nn.functional.pad(k, (0, 0, 0, pad), value=float("-inf")).reshape(b, kv, -1, self.page, d)
            self.pages[layer] = (lo.amin(3), hi.amax(3))
        kmin, kmax = self.pages[layer]  # [b, kv, P, d]
        qg = q.reshape(b, kv, h // kv, 1, d)
        bound = torch.maximum(qg * kmin[:, :, None], qg * kmax[:, :, None]).sum(-1).amax(2)  # [b, kv, P]
        n_pages = min(max(self.budget // self.page, 1), bound.shape[-1])
        chosen = torch.zeros_like(bound, dtype=torch.bool).scatter(-1, bound.topk(n_pages, -1).indices, True)
        mask = chosen.repeat_interleave(self.page, -1)[..., :n_prefill]
        return _with_new_tokens(mask, n)


class H2O(Selector):
    """Heavy-hitter oracle: accumulated attention plus a recent window; evicted keys stay evicted."""

    def __init__(self, budget: int = 256, recent: int | None = None):
        check_positive("budget", budget)
        self.budget = budget
        self.recent = budget // 2 if recent is None else recent
        self.acc: dict[int, torch.Tensor] = {}
        self.alive: dict[int, torch.Tensor] = {}

    def reset(self):
        self.acc.clear()
        self.alive.clear()

    def observe(self, layer, mass):
        acc = self.acc.get(layer)
        n = mass.shape[-1]
        self.acc[layer] = mass if acc is None else torch.nn.functional.pad(acc, (0, n - acc.shape[-1])) + mass

    def select(self, layer, scores, q, keys, n_prefill):
        b, _, n = scores.shape
        kv = keys.shape[2]
        acc = torch.nn.functional.pad(self.acc[layer], (0, n - self.acc[layer].shape[-1]))
        alive = self.alive.get(layer)
        if alive is None:
            alive = torch.ones(b, kv, n, dtype=torch.bool, device=scores.device)
        else:
            alive = torch.nn.functional.pad(alive, (0, n - alive.shape[-1]), value=True)
        recent = torch.arange(n, device=scores.device) >= n - self.recent
        heavy = min(max(self.budget - self.recent, 0), n)
        candidates = torch.where(alive & ~recent, acc, torch.full_like(acc, -1.0))
        keep = torch.zeros_like(alive).scatter(-1, candidates.topk(heavy, -1).indices, True) & alive & ~recent
        self.alive[layer] = keep | recent
        return self.alive[layer]


class Tactic(Selector, TailFit):
    """Cumulative-mass selection approximated by key clustering and an ``a/x + b`` fit of the score tail.

    The stopping rule (``sample_slices``, ``cutoff``) is the kernels' ``TailFit``, so the timed kernel
    (``tactic_decode_attention``) takes a ``Tactic`` and selects as this selector does.
    """

    def __init__(self, p: float = 0.9, cluster_size: int = 16, iters: int = 10, exact_frac: float = 0.02,
                 fit_at: tuple[float, float] = (0.1, 0.6), fit_window: int = 8, bridge: bool = True):
        _check_p(p)
        check_positive("cluster_size", cluster_size)
        TailFit.__init__(self, p, exact_frac, fit_at, fit_window, bridge)
        self.cluster_size, self.iters = cluster_size, iters
        self.clusters: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def reset(self):
        self.clusters.clear()

    def cluster(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k-means of ``keys [b, m, kv, d]`` per KV head -> centroids ``[b, kv, C, d]``, assignment ``[b, kv, m]``."""
        b, m, kv, d = keys.shape
        x = keys.permute(0, 2, 1, 3).reshape(b * kv, m, d).float()
        cent, assign = kmeans(x, math.ceil(m / self.cluster_size), self.iters)
        return cent.reshape(b, kv, -1, d), assign.reshape(b, kv, m)

    def order(self, layer: int, q: torch.Tensor, keys: torch.Tensor, n_prefill: int) -> torch.Tensor:
        """Prefill keys in the approximate descending-score order of each query head, ``[b, kv, g, m]``."""
        if layer not in self.clusters:
            self.clusters[layer] = self.cluster(keys[:, :n_prefill])
        cent, assign = self.clusters[layer]
        b, kv, c, d = cent.shape
        g = q.shape[1] // kv
        cscore = torch.einsum("bkgd,bkcd->bkgc", q.reshape(b, kv, g, d).float(), cent)
        rank = cscore.argsort(-1, descending=True).argsort(-1)  # rank of each cluster
        token_rank = rank.gather(-1, assign[:, :, None].expand(b, kv, g, n_prefill))
        return token_rank.argsort(dim=-1, stable=True)

    def select(self, layer, scores, q, keys, n_prefill):
        b, h, n = scores.shape
        kv = keys.shape[2]
        g = h // kv
        order = self.order(layer, q, keys, n_prefill)  # [b, kv, g, m]
        s = scores.reshape(b, kv, g, n).float()
        e = torch.exp(s - s.amax(-1, keepdim=True))
        e_ord = e[..., :n_prefill].gather(-1, order)
        k = self.cutoff(e_ord, e[..., n_prefill:].sum(-1))
        take_sorted = torch.arange(n_prefill) < k[..., None]
        chosen = torch.zeros_like(take_sorted).scatter(-1, order, take_sorted).any(2)
        return _with_new_tokens(chosen, n)


def make_selector(name: str, p: float = 0.9, budget: int = 256, **kw) -> Selector:
    """A selector by name (``SELECTORS``); ``p`` for topp/tactic, ``budget`` (keys) for the fixed-budget ones."""
    if name == "full":
        return Full()
    if name == "topp":
        return TopP(p)
    if name == "tactic":
        return Tactic(p, **kw)
    if name == "topk":
        return TopK(budget)
    if name == "quest":
        return Quest(budget, **kw)
    if name == "streaming":
        return StreamingLLM(budget, **kw)
    if name == "h2o":
        return H2O(budget, **kw)
    raise WorkbenchError(f"Unknown sparse-attention method {name!r}: choose one of {', '.join(SELECTORS)}.")


# ----------------------------------------------------------------------------- hooks and decoding


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


def _group_mass(pattern: torch.Tensor, n_kv: int) -> torch.Tensor:
    """``[b, heads, q, n]`` attention pattern -> mass per key per KV head, ``[b, kv, n]``."""
    b, h, _, n = pattern.shape
    return pattern.sum(2).reshape(b, n_kv, h // n_kv, n).sum(2)


def sparse_attention_hooks(model, selector: Selector, cache, n_prefill: int, metrics: StepMetrics | None = None,
                           layers: Sequence[int] | None = None) -> list:
    """Hooks that apply ``selector`` at every single-token decode step (prefill stays dense).

    ``cache`` is the model's KV cache (its values give the output-error metric); keys at
    positions ``>= n_prefill`` were generated during decoding and are always attended.
    """
    stash: dict[tuple[int, str], torch.Tensor] = {}
    n_kv = model.cfg.n_key_value_heads or model.cfg.n_heads
    pairs = []
    for L in range(model.cfg.n_layers) if layers is None else layers:
        def keep(x, hook, L=L, what=""):
            stash[(L, what)] = x
            return x

        def on_scores(scores, hook, L=L):
            if scores.shape[2] != 1:
                return scores
            s = scores[:, :, 0]
            mask = selector.select(L, s, stash[(L, "q")][:, -1], stash[(L, "k")], n_prefill)  # [b, kv, n]
            mask_h = mask.repeat_interleave(s.shape[1] // mask.shape[1], dim=1)
            if metrics is not None:
                _record(metrics, L, s, mask, mask_h, cache[L].past_values)
            return scores.masked_fill(~mask_h[:, :, None, :], float("-inf"))

        def on_pattern(pattern, hook, L=L):
            if pattern.shape[2] == 1:
                selector.observe(L, _group_mass(pattern, n_kv))
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


def prefill(model, tokens: torch.Tensor, chunk: int = 512):
    """Dense prefill of ``tokens [b, n]`` into a fresh KV cache, in chunks to bound memory.

    Returns ``(cache, patterns)``: ``patterns[L]`` is the prefill attention summed over queries,
    ``[b, heads, n]`` (what H2O accumulates).
    """
    cache = new_cache(model, tokens.shape[0])
    sums: dict[int, torch.Tensor] = {}

    def colsum(pattern, hook):
        L = hook.layer()
        add = pattern.sum(2)
        prev = sums.get(L)
        sums[L] = add if prev is None else torch.nn.functional.pad(prev, (0, add.shape[-1] - prev.shape[-1])) + add

    hooks = [(f"blocks.{L}.attn.hook_pattern", colsum) for L in range(model.cfg.n_layers)]
    decode_loop(model, cache, tokens, lambda step, logits: None, hooks, chunk)  # the prefill alone
    return cache, sums


def decode(model, tokens: torch.Tensor, n_prefill: int, selector: Selector, prefilled=None,
           chunk: int = 512, progress: bool = False, record_sites: Sequence[str] = ()) -> dict:
    """Teacher-forced decoding of ``tokens[:, n_prefill:]`` one token at a time with sparse attention.

    Returns next-token log-probabilities ``[b, steps, vocab]`` for positions
    ``n_prefill .. n-2`` (their targets are the following tokens), the targets, and per-layer
    metrics. ``prefilled`` = ``prefill(model, tokens[:, :n_prefill])`` to reuse one dense prefill.
    ``record_sites``: hook names whose activations at the decoded positions are returned as
    ``streams`` (``{site: (b * steps, d)}``), for the topology and SAE drift.
    """
    from tqdm.auto import tqdm

    if not 1 <= n_prefill < tokens.shape[1] - 1:
        raise WorkbenchError(f"n_prefill={n_prefill} must leave at least 2 tokens to decode in {tokens.shape[1]}.")
    cache, sums = prefilled if prefilled is not None else prefill(model, tokens[:, :n_prefill], chunk)
    cache = copy.deepcopy(cache)
    selector.reset()
    n_kv = model.cfg.n_key_value_heads or model.cfg.n_heads
    for L, s in sums.items():
        selector.observe(L, _group_mass(s[:, :, None], n_kv))
    metrics = StepMetrics(model.cfg.n_layers)
    hooks = sparse_attention_hooks(model, selector, cache, n_prefill, metrics)
    recorded: dict[str, list] = {site: [] for site in record_sites}
    hooks += [(site, lambda act, hook: recorded[hook.name].append(act[:, -1].float().clone())) for site in recorded]
    out = []
    last = tokens.shape[1] - 1  # the final token is only a target

    def choose(step, logits):  # teacher forcing: the next token of the text, whatever the model predicted
        out.append(logits.log_softmax(-1))
        bar.update()
        t = n_prefill + step + 1
        return tokens[:, t : t + 1] if t < last else None

    with tqdm(total=last - n_prefill, desc=type(selector).__name__, disable=not progress, leave=False) as bar:
        decode_loop(model, cache, tokens[:, n_prefill : n_prefill + 1], choose, hooks)
    streams = {site: torch.stack(acts, 1).reshape(-1, acts[0].shape[-1]) for site, acts in recorded.items()}
    return {"logprobs": torch.stack(out, 1), "targets": tokens[:, n_prefill + 1 :], "metrics": metrics.per_layer(),
            "streams": streams}


# ----------------------------------------------------------------------------- evaluation


MASS_METHODS = ("topp", "tactic")  # their parameter is P, the attention mass kept; the others' a budget in keys


def parse_method(spec: str) -> tuple[str, float | int | str | None]:
    """``"tactic:0.9"`` -> ``("tactic", 0.9)``, ``"topk:64"`` -> ``("topk", 64)``, ``"topk:auto"`` (Tactic's
    measured budget) -> ``("topk", "auto")``, no parameter -> None; a bad one is a one-line error."""
    name, _, param = spec.strip().partition(":")
    if name not in SELECTORS:
        raise WorkbenchError(f"Unknown sparse-attention method {name!r}: choose one of {', '.join(SELECTORS)}.")
    if not param:
        return name, None
    if name == "full":
        raise WorkbenchError(f"{spec!r}: full attention takes no parameter; write 'full'.")
    if param == "auto" and name not in MASS_METHODS:
        return name, "auto"
    try:
        value = float(param) if name in MASS_METHODS else int(param)
    except ValueError:
        what = "P in (0, 1], e.g. 0.9" if name in MASS_METHODS else "a budget in keys (a positive integer) or auto"
        raise WorkbenchError(f"Bad parameter {param!r} for {name}: use {what}.") from None
    if name in MASS_METHODS:
        _check_p(value)
    else:
        check_positive(f"{name} budget", value)
    return name, value


def parse_methods(methods: Sequence[str]) -> list[tuple[str, float | int | str | None]]:
    """Every method parsed and checked up front, so a typo fails before the model runs."""
    parsed = [parse_method(m) for m in methods]
    names = [name for name, _ in parsed]
    for i, (name, param) in enumerate(parsed):
        if param == "auto" and "tactic" not in names[:i]:
            raise WorkbenchError(f"Budget 'auto' ({name}:auto) needs a tactic method listed before it.")
    return parsed


def compare_attention(model, tokens: torch.Tensor, n_prefill: int, methods: Sequence[str],
                      chunk: int = 512, progress: bool = True, topology_layers: Sequence[int] | None = None,
                      topology_k: int = 128, sae=None, seed: int = 0) -> list[dict]:
    """Teacher-forced decode of ``tokens[:, n_prefill:]`` under each method vs full attention.

    One row per method: mean over layers and steps of the fraction of cached keys loaded
    (per KV head), the attention-mass recall and the relative error of the attention output
    (both against dense attention given the same inputs), the KL(full || sparse) of the
    next-token distribution, and the perplexity of the decoded tokens. Methods are
    ``name[:param]`` with param = P for topp/tactic or a budget in keys for the others;
    ``auto`` uses the mean number of keys Tactic loaded (list a tactic method first).
    ``topology_layers`` / ``sae`` add the drift of the decoded positions' persistent homology and SAE
    reconstruction against full attention (``workbench.tools.drift``).
    """
    import time

    from workbench.tools.drift import DriftMeter

    parsed = parse_methods(methods)
    meter = DriftMeter(model, topology_layers, topology_k, sae, seed)
    pre = prefill(model, tokens[:, :n_prefill], chunk)
    reference = decode(model, tokens, n_prefill, Full(), prefilled=pre, progress=progress, record_sites=meter.sites)
    if meter.sites:
        meter.set_reference(reference["streams"])
    ref_lp, targets = reference["logprobs"], reference["targets"]
    ppl_full = math.exp(-ref_lp.gather(-1, targets[..., None]).mean().item())
    rows, tactic_budget = [], None
    for name, param in parsed:
        if param == "auto":
            value = tactic_budget
        elif param is not None:
            value = param
        else:
            value = 0.9 if name in MASS_METHODS else 256
        selector = make_selector(name, p=value) if name in MASS_METHODS else make_selector(name, budget=value)
        t0 = time.perf_counter()
        out = decode(model, tokens, n_prefill, selector, prefilled=pre, progress=progress, record_sites=meter.sites)
        seconds = time.perf_counter() - t0
        lp = out["logprobs"]
        kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1).mean().item()
        met = {k: sum(v) / len(v) for k, v in out["metrics"].items()}
        if name == "tactic" and tactic_budget is None:
            tactic_budget = max(1, round(met["loaded"] * n_prefill))
        rows.append({
            "method": f"{name}:{value}" if name != "full" else "full",
            "loaded": met["loaded"],
            "recall": met["recall"],
            "out_err": met["out_err"],
            "kl": kl,
            "ppl": math.exp(-lp.gather(-1, targets[..., None]).mean().item()),
            "ppl_full": ppl_full,
            "context": n_prefill,
            "decode_steps": lp.shape[1],
            "seconds": seconds,
            "per_layer": out["metrics"],
        } | (meter.measure(out["streams"]) if meter.sites else {}))
    return rows


def attention_figure(rows: Sequence[dict], title: str = "Sparse attention"):
    """Plotly figure: loaded fraction, recall and KL per method (left), recall per layer (right)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=("fraction of keys loaded / mass recall",
                                                        "KL(full || sparse) per token", "recall per layer"))
    names = [r["method"] for r in rows]
    fig.add_bar(x=names, y=[r["loaded"] for r in rows], name="loaded", row=1, col=1)
    fig.add_bar(x=names, y=[r["recall"] for r in rows], name="recall", row=1, col=1)
    fig.add_bar(x=names, y=[r["kl"] for r in rows], name="KL", row=1, col=2)
    for r in rows:
        fig.add_scatter(y=r["per_layer"]["recall"], mode="lines", name=r["method"], row=1, col=3)
    fig.update_xaxes(title_text="layer", row=1, col=3)
    fig.update_layout(title=title, barmode="group", height=450, width=1400)
    return fig
