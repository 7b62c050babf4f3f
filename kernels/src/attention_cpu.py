"""Tactic decode attention compiled for the CPU (numba): one pass per KV head, no copies, no per-op overhead.

The same selection as ``attention.tactic_select`` (tests check that both choose the same clusters),
written as loops so a decode step reads the centroids, the rows of the clusters it scores and the
values of the clusters it keeps in place, in the cluster-sorted cache, and nothing else. In eager
torch the same step is ~150 small ops whose overhead alone exceeds dense attention below 16k keys.
Compiled on first use and cached on disk by numba (``NUMBA_CACHE_DIR`` moves the cache).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, fastmath=True)
def _dot(a, b):
    """Float32 dot product; fast-math lets LLVM vectorize the reduction (the order of a sum, as in BLAS)."""
    acc = np.float32(0.0)
    for t in range(a.shape[0]):
        acc += a[t] * b[t]
    return acc


@njit(cache=True)
def _below(cum, x):
    """How many entries of ``cum`` are below ``x``: the bins a key-count ``x`` passes (``(cum < x).sum()``)."""
    k = 0
    for b in range(cum.shape[0]):
        if cum[b] < x:
            k += 1
    return k


@njit(cache=True)
def _head(qg, cent, keys, values, starts, sizes, new_keys, new_values, p, exact_frac, fit1, fit2, bridge,
          first_frac, nb, out, chosen):
    g, d = qg.shape
    c = cent.shape[0]
    n = keys.shape[0]
    r = new_keys.shape[0]
    # rank: equal-width bins of q·centroid per query head, bin 0 the highest
    bins = np.empty((g, c), np.int64)
    bsize = np.zeros((g, nb), np.float32)
    for j in range(g):
        cs = np.empty(c, np.float32)
        for i in range(c):
            cs[i] = _dot(qg[j], cent[i])
        hi, lo = cs.max(), cs.min()
        span = max(hi - lo, np.float32(1e-12))
        for i in range(c):
            b = int((hi - cs[i]) / span * nb)
            b = min(b, nb - 1)
            bins[j, i] = b
            bsize[j, b] += sizes[i]
    cum = np.empty((g, nb), np.float32)
    for j in range(g):
        run = np.float32(0.0)
        for b in range(nb):
            run += bsize[j, b]
            cum[j, b] = run
    top = max(1, math.ceil(exact_frac * n))
    head = np.empty(g, np.int64)
    for j in range(g):
        head[j] = min(_below(cum[j], top) + 1, nb)
    scores = np.empty((g, n), np.float32)
    scored = np.zeros(c, np.bool_)
    mass = np.zeros((g, c), np.float32)
    ref = np.full(g, -np.inf, np.float32)
    new_s = np.empty((g, r), np.float32)
    for j in range(g):
        for i in range(r):
            new_s[j, i] = _dot(qg[j], new_keys[i])
    depth = np.empty(g, np.int64)
    counts = np.empty(g, np.int64)
    samples = np.zeros((g, 4), np.float32)
    new_mass = np.zeros(g, np.float32)
    first = True
    target = max(first_frac * n, 1.0)
    batch = np.empty(c, np.int64)
    while True:
        for j in range(g):
            depth[j] = min(max(_below(cum[j], target) + 1, head[j]), nb)
        m = 0
        for i in range(c):
            if not scored[i]:
                for j in range(g):
                    if bins[j, i] < depth[j]:
                        batch[m] = i
                        m += 1
                        break
        for a in range(m):
            i = batch[a]
            for row in range(starts[i], starts[i] + sizes[i]):
                for j in range(g):
                    scores[j, row] = _dot(qg[j], keys[row])
        if first:  # the first rows scored hold the top clusters: a safe reference for exp
            for a in range(m):
                i = batch[a]
                for row in range(starts[i], starts[i] + sizes[i]):
                    for j in range(g):
                        ref[j] = max(ref[j], scores[j, row])
            for j in range(g):
                for i in range(r):
                    ref[j] = max(ref[j], new_s[j, i])
        for a in range(m):
            i = batch[a]
            scored[i] = True
            for j in range(g):
                acc = np.float32(0.0)
                for row in range(starts[i], starts[i] + sizes[i]):
                    e = np.exp(scores[j, row] - ref[j])
                    scores[j, row] = e  # from here on the buffer holds exp-scores, which the attention reuses
                    acc += e
                mass[j, i] += acc
        if first:
            first = False
            for j in range(g):
                for f in range(2):
                    frac = fit1 if f == 0 else fit2
                    b = min(_below(cum[j], frac * n), nb - 1)
                    cid = 0
                    for i in range(c):
                        if bins[j, i] == b:
                            cid = i
                            break
                    acc = np.float32(0.0)
                    for row in range(starts[cid], starts[cid] + sizes[cid]):
                        acc += np.exp(_dot(qg[j], keys[row]) - ref[j])
                    samples[j, 2 * f] = cum[j, b] - bsize[j, b] / 2 + 0.5
                    samples[j, 2 * f + 1] = acc / max(sizes[cid], 1)
                acc = np.float32(0.0)
                for i in range(r):
                    new_s[j, i] = np.exp(new_s[j, i] - ref[j])
                    acc += new_s[j, i]
                new_mass[j] = acc
        for j in range(g):
            counts[j] = _count(mass[j], bins[j], bsize[j], cum[j], samples[j], new_mass[j], head[j], p, bridge, nb)
        done = True
        for j in range(g):
            if counts[j] > depth[j]:
                done = False
        if done or target >= n:
            break
        target *= 2
    for i in range(c):
        chosen[i] = False
        for j in range(g):
            if bins[j, i] < counts[j]:
                chosen[i] = True
    # attention over the chosen clusters (all scored) and the new tokens, from the exp-scores already computed;
    # each value row is read once for the whole group
    total = np.zeros(g, np.float32)
    acc_v = np.zeros((g, d), np.float32)
    for i in range(c):
        if chosen[i]:
            for row in range(starts[i], starts[i] + sizes[i]):
                _accumulate(scores[:, row], values[row], total, acc_v)
    for i in range(r):
        _accumulate(new_s[:, i], new_values[i], total, acc_v)
    for j in range(g):
        for t in range(d):
            out[j, t] = acc_v[j, t] / total[j]


@njit(cache=True, fastmath=True)
def _accumulate(w, v, total, acc):
    """``total += w``, ``acc += w ⊗ v`` for one value row ``v [d]`` and the group's weights ``w [g]``."""
    for j in range(w.shape[0]):
        total[j] += w[j]
        for t in range(v.shape[0]):
            acc[j, t] += w[j] * v[t]


@njit(cache=True)
def _count(mass, bins, bsize, cum, samples, new_mass, head, p, bridge, nb):
    """``TailFit.count`` for one query head (see its docstring)."""
    if p >= 1:
        return nb
    bmass = np.zeros(nb, np.float32)
    for i in range(mass.shape[0]):
        bmass[bins[i]] += mass[i]
    x1, y1, x2, y2 = samples[0], samples[1], samples[2], samples[3]
    a = (y1 - y2) / (1 / x1 - 1 / x2) if x1 != x2 else np.float32(0.0)
    b = y1 - a / x1
    mid = cum - bsize / 2 + np.float32(0.5)
    fit = a / mid + b
    if bridge:
        last = head - 1
        x0 = mid[last]
        y0 = bmass[last] / bsize[last]
        for k in range(nb):
            if mid[k] < x1:
                w = min(max((mid[k] - x0) / max(x1 - x0, np.float32(1e-6)), np.float32(0.0)), np.float32(1.0))
                fit[k] = (1 - w) * y0 + w * (a / x1 + b)
    tail = np.empty(nb, np.float32)
    run = np.float32(0.0)
    for k in range(nb - 1, -1, -1):
        tail[k] = run
        run += max(fit[k], np.float32(0.0)) * bsize[k]
    taken = new_mass
    for k in range(nb):
        taken += bmass[k]
        if taken >= p * (taken + tail[k]):
            return max(k + 1, head)
    return max(nb, head)


@njit(cache=True)
def _step(qg, cent, keys, values, starts, sizes, new_keys, new_values, p, exact_frac, fit1, fit2, bridge,
          first_frac, nb, out, chosen):
    for k in range(qg.shape[0]):
        _head(qg[k], cent[k], keys[k], values[k], starts[k], sizes[k], new_keys[k], new_values[k], p, exact_frac,
              fit1, fit2, bridge, first_frac, nb, out[k], chosen[k])


def tactic_decode_cpu(qg: np.ndarray, centroids, keys, values, starts, sizes, new_keys, new_values, fit):
    """All KV heads of one decode step: ``qg [kv, g, d]`` scaled -> ``(out [kv, g, d], chosen [kv, C])``."""
    kv, g, d = qg.shape
    out = np.empty((kv, g, d), np.float32)
    chosen = np.empty(centroids.shape[:2], np.bool_)
    _step(qg, centroids, keys, values, starts, sizes, new_keys, new_values, np.float32(fit.p), float(fit.exact_frac),
          float(fit.fit_at[0]), float(fit.fit_at[1]), bool(fit.bridge), float(fit.first_frac), int(fit.rank_bins),
          out, chosen)
    return out, chosen
