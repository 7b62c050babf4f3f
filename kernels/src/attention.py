"""Single-query decode attention on plain tensors: dense, and Tactic's sparse attention over a clustered cache.

The hooked model always computes dense scores, so the speed of a sparse method is measured here,
on the queries, keys and values of one decode step (``bench/bench_attention.py``). Tensors use the
KV-cache layout ``[kv_heads, n, d]``; queries are ``[heads, d]`` with grouped-query heads in order.

Tactic's clusters are a *layout*: ``cluster_cache`` sorts the prefill cache by k-means cluster once
(attention does not depend on the order of keys, and rotary position is already in them), so a
cluster is a contiguous run of rows, and a decode step reads the centroids (1/16 of the keys), the
clusters it ranks first and two small tail samples, nothing else. Every step is batched over KV
and query heads, with no Python loop per head or per cluster. The selectors in
``workbench.tools.sparse_attention`` call ``tactic_select`` with the model's own scores, so the
quality numbers and the timed kernel pick the same keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from workbench.errors import WorkbenchError


def kmeans(x: torch.Tensor, n_clusters: int, iters: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched Lloyd k-means on ``x [G, n, d]``: ``(centroids [G, C, d], assignment [G, n])``.

    Deterministic: initialized at evenly spaced points; an empty cluster keeps its centroid.
    """
    g, n, d = x.shape
    c = max(1, min(n_clusters, n))
    centroids = x[:, torch.linspace(0, n - 1, c).round().long()].clone()
    for _ in range(iters):
        assign = torch.cdist(x, centroids).argmin(-1)
        sums = torch.zeros_like(centroids).scatter_add_(1, assign[..., None].expand(g, n, d), x)
        counts = torch.zeros(g, c, dtype=x.dtype, device=x.device).scatter_add_(1, assign, torch.ones_like(assign, dtype=x.dtype))
        centroids = torch.where(counts[..., None] > 0, sums / counts.clamp_min(1)[..., None], centroids)
    return centroids, torch.cdist(x, centroids).argmin(-1)


@dataclass
class ClusteredCache:
    """A prefill KV cache sorted by k-means cluster, per KV head (``cluster_cache`` builds it).

    ``keys``/``values [kv, n, d]`` in cluster order (``values`` may be None for selection only),
    ``centroids [kv, C, d]``, cluster ``starts``/``sizes [kv, C]`` (rows of the sorted cache),
    ``cluster_of [kv, n]`` (cluster of each sorted row, non-decreasing) and ``perm [kv, n]`` (the
    original position of each sorted row).
    """

    keys: torch.Tensor
    values: torch.Tensor | None
    centroids: torch.Tensor
    starts: torch.Tensor
    sizes: torch.Tensor
    cluster_of: torch.Tensor
    perm: torch.Tensor

    @property
    def n(self) -> int:
        return self.keys.shape[1]

    def key_mask(self, chosen: torch.Tensor) -> torch.Tensor:
        """Chosen clusters ``[kv, C]`` -> chosen keys ``[kv, n]`` at their original positions."""
        return torch.zeros_like(chosen[:, :1]).expand(-1, self.n).clone().scatter_(
            1, self.perm, chosen.gather(1, self.cluster_of))

    def loaded(self, chosen: torch.Tensor) -> float:
        """Fraction of the cached keys in the chosen clusters."""
        return float((self.sizes * chosen).sum()) / (self.sizes.shape[0] * self.n)


def cluster_cache(keys: torch.Tensor, values: torch.Tensor | None = None, cluster_size: int = 16,
                  iters: int = 10, sinks: int = 1) -> ClusteredCache:
    """Sort a prefill cache ``keys [kv, n, d]`` (and ``values``) by k-means cluster, ~``cluster_size`` keys each.

    The first ``sinks`` positions are clusters of their own (their centroid is the key itself): an attention
    sink draws much of a head's mass from a key unlike the others, and inside a k-means cluster its score
    would be hidden behind a mediocre centroid.
    """
    kv, n, d = keys.shape
    sinks = max(0, min(sinks, n - 1))
    cent, assign = kmeans(keys[:, sinks:].float(), math.ceil((n - sinks) / cluster_size), iters)
    if sinks:
        own = torch.arange(sinks, device=keys.device).expand(kv, sinks)
        cent = torch.cat([keys[:, :sinks].float(), cent], 1)
        assign = torch.cat([own, assign + sinks], 1)
    c = cent.shape[1]
    perm = assign.argsort(dim=1, stable=True)
    sizes = torch.zeros(kv, c, dtype=torch.long, device=keys.device).scatter_add_(1, assign, torch.ones_like(assign))
    rows = torch.arange(kv, device=keys.device)[:, None]
    return ClusteredCache(
        keys=keys[rows, perm].contiguous(), values=None if values is None else values[rows, perm].contiguous(),
        centroids=cent.to(keys.dtype), starts=sizes.cumsum(1) - sizes, sizes=sizes,
        cluster_of=assign.gather(1, perm), perm=perm)


def _rows_of(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``mask [kv, n]`` -> the selected row indices per KV head, padded: ``idx [kv, W]``, ``valid [kv, W]``."""
    counts = mask.sum(1)
    width = int(counts.max()) if counts.numel() else 0
    rows, cols = mask.nonzero(as_tuple=True)
    slot = torch.arange(rows.numel(), device=mask.device) - (counts.cumsum(0) - counts)[rows]
    idx = torch.zeros(mask.shape[0], width, dtype=torch.long, device=mask.device)
    idx[rows, slot] = cols
    return idx, torch.arange(width, device=mask.device) < counts[:, None]


class TailFit:
    """Tactic's stopping rule: how many clusters, in approximate score order, reach attention mass ``p``.

    Shared by the Tactic selector (quality, on the hooked model) and ``tactic_decode_attention``
    (speed, on plain tensors) through ``tactic_select``. Arguments are not checked here; the selector checks them.
    """

    def __init__(self, p: float = 0.9, exact_frac: float = 0.02, fit_at: tuple[float, float] = (0.1, 0.6),
                 bridge: bool = True, first_frac: float = 0.02, rank_bins: int = 256):
        self.p, self.exact_frac, self.fit_at, self.bridge = p, exact_frac, fit_at, bridge
        self.first_frac, self.rank_bins = first_frac, rank_bins

    def count(self, mass: torch.Tensor, sizes: torch.Tensor, samples: tuple, new_mass: torch.Tensor,
              head: torch.Tensor) -> torch.Tensor:
        """How many clusters to take, in order, from their exact masses ``mass [..., C]`` (in rank order).

        Clusters taken are loaded and scored anyway, so their mass is exact; the mass of the
        clusters not taken is the ``a/x + b`` curve (x: key rank) through the mean exp-score of
        two sample clusters near key ranks 10 % and 60 % (Tactic), times each cluster's size at
        its middle rank. With ``bridge`` (our addition), ranks between the exactly scored head
        (``head`` clusters, >= 2 % of the keys) and the first sample are interpolated linearly
        from the head's last cluster: otherwise a tail that has died out by 10 % fits as zero
        and the keys between 2 % and 10 % of a peaked head are never taken. The first ``k``
        clusters suffice once ``taken >= P * (taken + tail(k))``. ``samples``: ``(x1, y1, x2, y2)``.
        """
        c = mass.shape[-1]
        if self.p >= 1:  # every key has some mass: all of them
            return torch.full(mass.shape[:-1], c, dtype=torch.long, device=mass.device)
        x1, y1, x2, y2 = samples
        cum = sizes.cumsum(-1)
        mid = cum - sizes / 2 + 0.5
        a = torch.where(x1 != x2, (y1 - y2) / (1 / x1 - 1 / x2), torch.zeros_like(y1))
        b = y1 - a / x1
        fit = a[..., None] / mid + b[..., None]
        if self.bridge:
            last = head[..., None] - 1
            x0 = mid.gather(-1, last)
            y0 = mass.gather(-1, last) / sizes.gather(-1, last)
            w = ((mid - x0) / (x1[..., None] - x0).clamp_min(1e-6)).clamp(0, 1)
            bridged = (1 - w) * y0 + w * (a / x1 + b)[..., None]
            fit = torch.where(mid < x1[..., None], bridged, fit)
        fit = fit.clamp_min(0) * sizes
        tail = fit.flip(-1).cumsum(-1).flip(-1) - fit  # fitted mass of the clusters after each one
        taken = mass.cumsum(-1) + new_mass[..., None]
        done = taken >= self.p * (taken + tail)
        done[..., -1] = True
        return torch.maximum(done.float().argmax(-1) + 1, head)


def tactic_select(qg: torch.Tensor, cache: ClusteredCache, fit: TailFit,
                  score_rows: Callable[[torch.Tensor], torch.Tensor], new_scores: torch.Tensor | None = None):
    """Tactic's selection for one decode step, batched over KV heads and the query heads of each group.

    ``qg [kv, g, d]`` ranks the clusters by q·centroid; ``score_rows(idx [kv, W]) -> [kv, g, W]``
    gives the scaled scores of sorted-cache rows (the kernel computes them from the keys, the
    selector reads the model's own); ``new_scores [kv, g, r]`` are those of the tokens decoded
    since the prefill, always attended.

    The ranking is by ``fit.rank_bins`` equal-width bins of q·centroid per query head instead
    of a full sort (a sort of a few thousand scores costs more on a CPU than the attention it
    saves); clusters in one bin are taken together. Rows are scored a prefix of bins at a time
    (starting at ``fit.first_frac`` of the keys, doubling until the stopping rule stops inside
    the prefix of every query head), plus the two tail samples.

    Returns ``(chosen [kv, C], chunks)``: the chosen clusters (the union over each group) and the
    scored rows as a list of ``(idx [kv, W], valid [kv, W], scores [kv, g, W])``.
    """
    kv, g, _ = qg.shape
    c = cache.sizes.shape[1]
    n, nb, dev = cache.n, fit.rank_bins, qg.device
    has_new = new_scores is not None and new_scores.shape[-1] > 0
    rank_score = torch.bmm(qg.float(), cache.centroids.float().transpose(1, 2))  # [kv, g, C]
    hi, lo = rank_score.amax(-1, keepdim=True), rank_score.amin(-1, keepdim=True)
    bins = ((hi - rank_score) / (hi - lo).clamp_min(1e-12) * nb).long().clamp_max(nb - 1)  # 0: the highest scores
    sizes = torch.zeros(kv, g, nb, device=dev).scatter_add_(-1, bins, cache.sizes[:, None].expand(kv, g, c).float())
    cum = sizes.cumsum(-1)
    head = ((cum < max(1, math.ceil(fit.exact_frac * n))).sum(-1) + 1).clamp_max(nb)  # bins scored exactly
    of_cluster = cache.cluster_of
    scored = torch.zeros(kv, c, dtype=torch.bool, device=dev)
    mass = torch.zeros(kv, g, c, device=dev)
    chunks: list = []
    ref = samples = new_mass = None
    target = max(fit.first_frac * n, 1.0)
    while True:
        depth = torch.maximum((cum < target).sum(-1) + 1, head).clamp_max(nb)  # bins per query head
        new = (bins < depth[..., None]).any(1) & ~scored
        if bool(new.any()):
            idx, valid = _rows_of(new.gather(1, of_cluster))
            s = score_rows(idx).float()
            if ref is None:  # the first chunk holds the top clusters: a safe reference for exp
                ref = s.masked_fill(~valid[:, None], float("-inf")).amax(-1, keepdim=True)
                if has_new:
                    ref = torch.maximum(ref, new_scores.float().amax(-1, keepdim=True))
            e = torch.exp(s - ref) * valid[:, None]
            mass.scatter_add_(-1, of_cluster.gather(1, idx)[:, None].expand(kv, g, -1), e)
            chunks.append((idx, valid, s))
            scored |= new
        if samples is None:
            samples = _tail_samples(fit, cache, bins, sizes, cum, score_rows, ref)
            new_mass = torch.exp(new_scores.float() - ref).sum(-1) if has_new else torch.zeros(kv, g, device=dev)
        bin_mass = torch.zeros(kv, g, nb, device=dev).scatter_add_(-1, bins, mass)
        counts = fit.count(bin_mass, sizes, samples, new_mass, head)
        if bool((counts <= depth).all()) or target >= n:
            break
        target *= 2
    return (bins < counts[..., None]).any(1), chunks


def _tail_samples(fit: TailFit, cache: ClusteredCache, bins, sizes, cum, score_rows, ref):
    """Mean exp-score and middle key rank of a cluster in the bin at key ranks ``fit.fit_at``, per query head."""
    kv, g, _ = bins.shape
    n = cache.n
    width = int(cache.sizes.max())
    offs = torch.arange(width, device=bins.device)
    out = []
    for frac in fit.fit_at:
        b = (cum < frac * n).sum(-1, keepdim=True).clamp_max(fit.rank_bins - 1)  # [kv, g, 1]
        cid = (bins == b).int().argmax(-1)  # the first cluster of that bin, [kv, g]
        start, size = cache.starts.gather(1, cid), cache.sizes.gather(1, cid)
        idx = (start[..., None] + offs).clamp_max(n - 1).reshape(kv, g * width)
        s = score_rows(idx).float().reshape(kv, g, g, width)  # every query head of the group on every sample
        s = s.diagonal(dim1=1, dim2=2).permute(0, 2, 1)  # each head on its own sample: [kv, g, width]
        e = torch.exp(s - ref) * (offs < size[..., None])
        out += [(cum.gather(-1, b) - sizes.gather(-1, b) / 2 + 0.5)[..., 0], e.sum(-1) / size.clamp_min(1)]
    return out[0], out[1], out[2], out[3]


def _grouped(q: torch.Tensor, kv: int, scale: float | None) -> torch.Tensor:
    """``q [h, d]`` -> scaled ``[kv, g, d]``, grouped-query heads under their KV head (scale 1/sqrt(d) by default)."""
    h, d = q.shape
    return q.reshape(kv, h // kv, d) * (scale if scale is not None else d**-0.5)


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Dense single-query attention (the baseline): ``q [h, d]``, ``keys/values [kv, n, d]`` -> ``[h, d]``."""
    qg = _grouped(q, keys.shape[0], scale)
    return torch.bmm(torch.bmm(qg, keys.transpose(1, 2)).softmax(-1), values).reshape(q.shape)


def tactic_decode_attention(q: torch.Tensor, cache: ClusteredCache, fit: TailFit | None = None,
                            new_keys: torch.Tensor | None = None, new_values: torch.Tensor | None = None,
                            scale: float | None = None, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Tactic decode attention that reads only what it needs: returns ``(output [h, d], chosen clusters [kv, C])``.

    ``cache`` is the clustered prefill (``cluster_cache``); ``new_keys``/``new_values [kv, r, d]``
    the tokens decoded since, always attended. ``fit``: the stopping rule (a ``Tactic`` selector
    is one), P = 0.9 by default. ``backend``: ``"numba"`` (the compiled CPU kernel,
    ``attention_cpu``), ``"torch"`` (``tactic_select`` in batched torch ops: any device; scores of
    the rows it reads are computed once and reused, values of the chosen rows alone are read) or
    ``"auto"`` (numba for float32 CPU tensors, torch otherwise).
    """
    fit = fit or TailFit()
    h, d = q.shape
    kv, n, _ = cache.keys.shape
    g = h // kv
    qg = _grouped(q, kv, scale)
    if new_keys is None:
        new_keys = new_values = cache.keys.new_zeros(kv, 0, d)
    if cache.values is None:
        raise WorkbenchError("this clustered cache holds keys only: build it with cluster_cache(keys, values)")
    cpu32 = q.device.type == "cpu" and q.dtype == cache.keys.dtype == torch.float32
    if backend == "auto":
        backend = "numba" if cpu32 else "torch"
    if backend not in ("numba", "torch"):
        raise WorkbenchError(f"unknown backend {backend!r}: use 'auto', 'numba' or 'torch'")
    if backend == "numba" and not cpu32:
        raise WorkbenchError("backend='numba' runs float32 CPU tensors: use backend='torch' (or 'auto') for others")
    if backend == "numba":
        from .attention_cpu import tactic_decode_cpu

        out, chosen = tactic_decode_cpu(*(t.numpy() for t in (qg, cache.centroids, cache.keys, cache.values,
                                                              cache.starts, cache.sizes, new_keys, new_values)), fit)
        return torch.from_numpy(out).reshape(h, d), torch.from_numpy(chosen)
    flat_keys = cache.keys.reshape(kv * n, d)
    base = torch.arange(kv, device=q.device)[:, None] * n

    def score_rows(idx):
        rows = flat_keys.index_select(0, (idx + base).reshape(-1)).reshape(kv, -1, d)
        return torch.bmm(qg, rows.transpose(1, 2))

    new_scores = torch.bmm(qg, new_keys.transpose(1, 2))
    chosen, chunks = tactic_select(qg, cache, fit, score_rows, new_scores)
    idx = torch.cat([c[0] for c in chunks], 1)
    keep = torch.cat([c[1] for c in chunks], 1) & chosen.gather(1, cache.cluster_of.gather(1, idx))
    pick, pick_valid = _rows_of(keep)  # positions within the scored rows that were chosen
    scores = torch.cat([c[2] for c in chunks], 2).gather(2, pick[:, None].expand(kv, g, -1))
    scores = torch.cat([scores.masked_fill(~pick_valid[:, None], float("-inf")), new_scores], -1)
    rows = idx.gather(1, pick)
    vals = cache.values.reshape(kv * n, d).index_select(0, (rows + base).reshape(-1)).reshape(kv, -1, d)
    vals = torch.cat([vals, new_values], 1)
    return torch.bmm(scores.softmax(-1).to(vals.dtype), vals).reshape(h, d), chosen
