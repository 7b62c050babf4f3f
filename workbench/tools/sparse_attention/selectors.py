"""Selectors: which cached keys each KV head reads at a decode step, as a mask ``[batch, kv_heads, keys]``.

Grouped-query heads share one selection (it is the KV head's data that is loaded), and tokens
generated after the prefill are always attended. Methods (``make_selector``):

- ``full``: dense attention (the reference).
- ``topp``: oracle cumulative mass -- per query head the smallest set of keys whose exact
  softmax mass reaches P, union over the group.
- ``tactic``: the Tactic approximation of ``topp`` without scoring every key: k-means of
  each head's prefill keys (~16 keys per cluster, 10 iterations), clusters ranked by
  query·centroid (in 256 equal-width bins), taken in that order (at least the top
  ``exact_frac`` of the keys) until their exact mass reaches P of the total, where the mass of
  the clusters not taken is estimated by an ``a/x + b`` curve through the exp-scores of two
  sample clusters near the 10 % and 60 % key ranks (bridged linearly to the exactly scored
  head, see ``TailFit.count``). Keys are clustered once at the first decode step (Tactic
  re-clusters every 2048 steps; decodes here are shorter).
- ``topk``: oracle top-k at a fixed budget (group-mean attention probability).
- ``quest``: Quest page bounds -- pages of 16 keys, channel-wise min/max, pages ranked by
  the upper bound of q·k, top pages up to the budget.
- ``streaming``: StreamingLLM, 4 sink tokens plus the most recent keys.
- ``h2o``: H2O heavy hitters, the keys with the largest accumulated attention (from the
  prefill and every decode step so far) plus a recent window; evicted keys never return.

A selector only reads the score entries its method would have computed, so the quality
numbers measured with it are those of the method.
"""

from __future__ import annotations

import torch

from workbench.errors import WorkbenchError
from workbench.kernels.attention import ClusteredCache, TailFit, cluster_cache, tactic_select

SELECTORS = ("full", "topp", "tactic", "topk", "quest", "streaming", "h2o")


def check_p(p: float) -> None:
    """P must be an attention mass in (0, 1]; checked where a user's P enters (selectors, ``--methods``)."""
    if not (isinstance(p, int | float) and 0 < p <= 1):
        raise WorkbenchError(f"P={p} is outside (0, 1]: the attention mass to keep must be in (0, 1] (0.9 is usual).")


def check_positive(name: str, value) -> None:
    """Budgets, page and cluster sizes, context lengths: a positive integer, or a one-line error."""
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
        check_p(p)
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

    The selection is the kernels' ``tactic_select`` on the model's own scores, over the same
    cluster-sorted cache (``cluster_cache``) and with the same stopping rule (``TailFit``), so the
    timed kernel (``tactic_decode_attention``) picks the keys whose quality this selector measures.
    """

    def __init__(self, p: float = 0.9, cluster_size: int = 16, iters: int = 10, exact_frac: float = 0.02,
                 fit_at: tuple[float, float] = (0.1, 0.6), bridge: bool = True, first_frac: float = 0.02,
                 rank_bins: int = 256):
        check_p(p)
        check_positive("cluster_size", cluster_size)
        check_positive("rank_bins", rank_bins)
        TailFit.__init__(self, p, exact_frac, fit_at, bridge, first_frac, rank_bins)
        self.cluster_size, self.iters = cluster_size, iters
        self.caches: dict[int, ClusteredCache] = {}

    def reset(self):
        self.caches.clear()

    def select(self, layer, scores, q, keys, n_prefill):
        b, h, n = scores.shape
        kv, d = keys.shape[2], keys.shape[3]
        g = h // kv
        if layer not in self.caches:  # batch rows and KV heads are independent heads to the kernel
            prefill_keys = keys[:, :n_prefill].permute(0, 2, 1, 3).reshape(b * kv, n_prefill, d).float()
            self.caches[layer] = cluster_cache(prefill_keys, None, self.cluster_size, self.iters)
        cache = self.caches[layer]
        s = scores.reshape(b * kv, g, n).float()
        in_order = s[..., :n_prefill].gather(-1, cache.perm[:, None].expand(-1, g, -1))  # scores of the sorted rows
        chosen, _ = tactic_select(q.reshape(b * kv, g, d).float(), cache, self,
                                  lambda idx: in_order.gather(-1, idx[:, None].expand(-1, g, -1)), s[..., n_prefill:])
        return _with_new_tokens(cache.key_mask(chosen).reshape(b, kv, n_prefill), n)


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
