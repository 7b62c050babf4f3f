"""Single-query decode attention on plain tensors: dense, over selected keys, and Tactic's selection.

The hooked model always computes dense scores, so the speed of a sparse method is measured
here, on the queries, keys and values of one decode step (``bench/bench_attention.py``). These
functions know nothing of models or hooks; the selectors in ``workbench.tools.sparse_attention``
reuse ``kmeans`` and ``TailFit`` so the quality numbers and the timed kernel pick the same keys.
"""

from __future__ import annotations

import math

import torch


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


class TailFit:
    """Tactic's stopping rule: how many keys, in approximate score order, reach attention mass ``p``.

    Shared by the Tactic selector (quality, on the hooked model) and ``tactic_decode_attention``
    (speed, on plain tensors). Arguments are not checked here; the selector checks them.
    """

    def __init__(self, p: float = 0.9, exact_frac: float = 0.02, fit_at: tuple[float, float] = (0.1, 0.6),
                 fit_window: int = 8, bridge: bool = True):
        self.p, self.exact_frac, self.fit_at, self.fit_window, self.bridge = p, exact_frac, fit_at, fit_window, bridge

    def sample_slices(self, m: int) -> list[tuple[int, int]]:
        """Rank ranges ``[lo, hi)`` whose exp-scores the tail fit reads."""
        out = []
        for frac in self.fit_at:
            lo = min(max(int(frac * m) - self.fit_window // 2, 0), max(m - self.fit_window, 0))
            out.append((lo, min(lo + self.fit_window, m)))
        return out

    def cutoff(self, e_ord: torch.Tensor, new_mass: torch.Tensor) -> torch.Tensor:
        """How many keys to take, in order, from the ordered exp-scores ``e_ord [..., m]``.

        Keys taken are loaded and scored anyway, so their mass is exact; the mass of the keys
        not taken is the ``a/x + b`` tail through two small samples near ranks 10 % and 60 %
        (Tactic). With ``bridge`` (our addition), ranks between the exactly scored head (2 %)
        and the first sample are interpolated linearly from the head's last value: otherwise
        a tail that has died out by 10 % fits as zero and the keys between 2 % and 10 % of a
        peaked head are never taken. The first ``k`` keys suffice once
        ``taken >= P * (taken + tail(k))``; keys beyond ``k`` outside the samples are never read.
        """
        m = e_ord.shape[-1]
        if self.p >= 1:  # every key has some mass: all of them
            return torch.full(e_ord.shape[:-1], m, dtype=torch.long, device=e_ord.device)
        x = torch.arange(1, m + 1, dtype=e_ord.dtype, device=e_ord.device)
        (lo1, hi1), (lo2, hi2) = self.sample_slices(m)
        x1, x2 = (lo1 + hi1 + 1) / 2, (lo2 + hi2 + 1) / 2
        y1, y2 = e_ord[..., lo1:hi1].mean(-1), e_ord[..., lo2:hi2].mean(-1)
        a = (y1 - y2) / (1 / x1 - 1 / x2) if x1 != x2 else torch.zeros_like(y1)
        b = y1 - a / x1
        fit = a[..., None] / x + b[..., None]
        top = max(1, math.ceil(self.exact_frac * m))  # Tactic always scores the head of the order
        if self.bridge and top < x1:
            # between the exactly scored head and the first sample, interpolate linearly from the
            # head's last (already read) value, instead of trusting the a/x + b extrapolation
            x0, y0 = float(top), e_ord[..., top - 1 : top].mean(-1)
            w = ((x - x0) / (x1 - x0)).clamp(0, 1)
            fit = torch.where(x < x1, (1 - w) * y0[..., None] + w * (a / x1 + b)[..., None], fit)
        fit = fit.clamp_min(0)
        tail = fit.flip(-1).cumsum(-1).flip(-1) - fit  # fitted mass of ranks k+1..m, for k = 1..m
        taken = e_ord.cumsum(-1) + new_mass[..., None]
        done = taken >= self.p * (taken + tail)
        done[..., -1] = True
        k = done.float().argmax(-1) + 1
        return k.clamp(min(top, m), m)


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Dense single-query attention: ``q [h, d]``, ``keys/values [n, kv, d]`` -> ``[h, d]``."""
    h, d = q.shape
    kv = keys.shape[1]
    qg = q.reshape(kv, h // kv, d)
    scores = torch.einsum("kgd,nkd->kgn", qg, keys) / math.sqrt(d)
    return torch.einsum("kgn,nkd->kgd", scores.softmax(-1), values).reshape(h, d)


def tactic_decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, centroids: torch.Tensor,
                            members: torch.Tensor, tactic: TailFit | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tactic decode attention that scores only what it needs: returns ``(output [h, d], selection [kv, n])``.

    ``centroids [kv, C, d]`` and ``members [kv, C, s]`` (key indices per cluster, padded with
    -1) come from the prefill (``cluster_members``). Per KV head: rank clusters by
    q·centroid for each query head of the group, score the fit samples and a prefix of the
    order (doubling it until ``tactic.cutoff`` stops inside it), then attend over the union
    of the group's selections. Keys outside the prefixes and samples are never touched.
    ``tactic``: the stopping rule (a ``Tactic`` selector is one), P = 0.9 by default.
    """
    tactic = tactic or TailFit()
    h, d = q.shape
    kv, c, s = members.shape
    n = keys.shape[0]
    g = h // kv
    qg = q.reshape(kv, g, d) / math.sqrt(d)
    kt = keys.transpose(0, 1)  # [kv, n, d]
    rank = torch.einsum("kgd,kcd->kgc", qg, centroids).argsort(-1, descending=True)  # [kv, g, C]
    order = members[torch.arange(kv)[:, None, None], rank].reshape(kv, g, c * s)
    idx = order[order >= 0].reshape(kv, g, n)  # keys of each query head, approximately by score
    heads = torch.arange(kv)[:, None, None]

    def exp_scores(cols):
        return torch.exp(torch.einsum("kgd,kgnd->kgn", qg, kt[heads, idx[:, :, cols]]))

    e_ord = torch.zeros(kv, g, n)
    samples = torch.cat([torch.arange(lo, hi) for lo, hi in tactic.sample_slices(n)])
    e_ord[:, :, samples] = exp_scores(samples)
    done, prefix = 0, max(1, math.ceil(tactic.exact_frac * n))
    while True:
        e_ord[:, :, done:prefix] = exp_scores(slice(done, prefix))
        counts = tactic.cutoff(e_ord, torch.zeros(kv, g))
        if bool((counts <= prefix).all()) or prefix == n:
            break
        done, prefix = prefix, min(2 * prefix, n)
    take = torch.arange(n) < counts[..., None]  # [kv, g, n] in each head's order
    mask = torch.zeros(kv, g, n, dtype=torch.bool).scatter(-1, idx, take).any(1)  # union over the group
    return sparse_decode_attention(q, keys, values, mask), mask


def sparse_decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                            mask: torch.Tensor) -> torch.Tensor:
    """Single-query attention over the selected keys only: ``mask [kv, n]`` -> output ``[h, d]``.

    Gathers the selected keys and values (padded to the largest selection of the KV heads)
    and attends over them; unselected keys are never read.
    """
    h, d = q.shape
    kv, n = mask.shape
    qg = q.reshape(kv, h // kv, d) / math.sqrt(d)
    width = int(mask.sum(-1).max())
    sel = mask.to(torch.int8).argsort(dim=-1, descending=True, stable=True)[:, :width]  # selected keys first
    valid = torch.gather(mask, 1, sel)
    rows = torch.arange(kv)[:, None]
    scores = torch.einsum("kgd,knd->kgn", qg, keys.transpose(0, 1)[rows, sel])
    scores = scores.masked_fill(~valid[:, None], float("-inf"))
    return torch.einsum("kgn,knd->kgd", scores.softmax(-1), values.transpose(0, 1)[rows, sel]).reshape(h, d)


def cluster_members(keys: torch.Tensor, cluster_size: int = 16, iters: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill clustering for ``tactic_decode_attention``: ``keys [n, kv, d]`` -> centroids, padded member lists."""
    n, kv, d = keys.shape
    cent, assign = kmeans(keys.permute(1, 0, 2).float(), math.ceil(n / cluster_size), iters)
    c = cent.shape[1]
    size = int(torch.bincount(assign.flatten() + torch.arange(kv).repeat_interleave(n) * c, minlength=kv * c).max())
    members = torch.full((kv, c, size), -1, dtype=torch.long)
    for k in range(kv):
        order = assign[k].argsort(stable=True)
        counts = torch.bincount(assign[k], minlength=c)
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.arange(n) - starts[assign[k][order]]
        members[k, assign[k][order], slot] = order
    return cent, members
