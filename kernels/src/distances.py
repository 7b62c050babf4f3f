"""Pairwise distances between point sets: dense, tiled, thresholded and k-nearest.

A distance matrix is a GEMM (``|x|^2 + |y|^2 - 2 x.y``), which is fast but loses
precision when the points sit far from the origin: both sets are centered on their
common mean first (distances do not change, most of the cancellation goes away). Pairs
still much closer than their norms (duplicates, tight clusters away from the mean; the
Gram form gives them errors of ``sqrt(eps) * |x|``) are recomputed exactly as
``sum((x - y)**2)``, so small distances, the ones H0 and the MST depend on, are accurate.
Cosine distance is computed as ``|x/|x| - y/|y||^2 / 2`` through the same path, which keeps
it accurate for nearly parallel vectors. Self-distances are exactly symmetric with an exact
zero diagonal.

CUDA tensors in float32 (or half precision, computed in float32) go through the Triton
kernel (``workbench.kernels.triton_distances``); float64 and CPU tensors through torch. ``backend="triton"`` forces the kernel (on CPU tensors it
needs ``TRITON_INTERPRET=1``). NumPy inputs give NumPy outputs, tensors give tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, NamedTuple

import numpy as np
import torch

from workbench.errors import WorkbenchError

from . import triton_distances

Metric = Literal["euclidean", "sqeuclidean", "cosine"]
Backend = Literal["auto", "torch", "triton"]
METRICS = ("euclidean", "sqeuclidean", "cosine")
DEFAULT_BLOCK = 1024


def _to_tensor(a) -> tuple[torch.Tensor, bool]:
    """The input as a floating tensor, and whether the caller gave NumPy."""
    if isinstance(a, torch.Tensor):
        t = a
        was_numpy = False
    else:
        t = torch.from_numpy(np.ascontiguousarray(a))
        was_numpy = True
    if t.ndim != 2:
        raise WorkbenchError(f"points must be a 2-D array (n_points, dim); got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        t = t.to(torch.float32)
    elif t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    return t, was_numpy


def _out(t: torch.Tensor, was_numpy: bool):
    return t.cpu().numpy() if was_numpy else t


class _Side(NamedTuple):
    """One point set ready for the GEMM: the points as the metric sees them (normalised for
    cosine; used for exact differences), a centered copy, its squared row norms, and the
    augmented rows ``[c, |c|^2, 1]`` / ``[-2c, 1, |c|^2]`` whose product is the whole squared
    distance in one GEMM (no separate passes to add the norms)."""

    raw: torch.Tensor
    c: torch.Tensor
    sq: torch.Tensor
    left: torch.Tensor
    right: torch.Tensor

    def rows(self, s: int, e: int | None = None) -> _Side:
        return _Side(*(t[s:e] for t in self))

    def float(self) -> _Side:
        return _Side(*(t.float() for t in self))


def _prepare(X: torch.Tensor, Y: torch.Tensor | None, metric: str) -> tuple[_Side, _Side | None]:
    """Both sets centered on their common mean (normalised first for cosine)."""
    if metric not in METRICS:
        raise WorkbenchError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    if Y is not None:
        if Y.shape[1] != X.shape[1]:
            raise WorkbenchError(f"X and Y have different dimensions ({X.shape[1]} vs {Y.shape[1]})")
        Y = Y.to(device=X.device, dtype=torch.promote_types(X.dtype, Y.dtype))
        X = X.to(Y.dtype)
    if metric == "cosine":
        X = _normalise(X, "X")
        Y = None if Y is None else _normalise(Y, "Y")
    # The mean in float64 so that centering itself does not add error on offset data.
    total = X.sum(0, dtype=torch.float64)
    count = X.shape[0]
    if Y is not None:
        total = total + Y.sum(0, dtype=torch.float64)
        count += Y.shape[0]
    mu = (total / max(count, 1)).to(X.dtype)

    def side(P: torch.Tensor) -> _Side:
        Pc = (P - mu).contiguous()
        sq = (Pc * Pc).sum(1, keepdim=True)
        one = torch.ones_like(sq)
        return _Side(P, Pc, sq[:, 0], torch.cat([Pc, sq, one], 1), torch.cat([-2 * Pc, one, sq], 1))

    return side(X), None if Y is None else side(Y)


def _normalise(X: torch.Tensor, name: str) -> torch.Tensor:
    norms = torch.linalg.vector_norm(X, dim=1, keepdim=True)
    zero = torch.nonzero(norms[:, 0] == 0).flatten().tolist()
    if zero:
        raise WorkbenchError(
            f"cosine distance is undefined for zero vectors: rows {zero[:10]} of {name}; drop them or use metric='euclidean'"
        )
    return X / norms


def _finish(sq: torch.Tensor, metric: str) -> torch.Tensor:
    """In place: clamp rounding negatives, then take the root / halve for the metric."""
    sq.clamp_min_(0)
    if metric == "euclidean":
        sq.sqrt_()
    elif metric == "cosine":
        sq.mul_(0.5)
    return sq


def _sq_block(xs: _Side, ys: _Side, diag: int | None = None) -> torch.Tensor:
    """Squared distances of a row block to all columns (torch path, unclamped, refined).

    ``diag``: column where this block meets the diagonal of a self-distance matrix; those
    entries are set to exactly 0 (and kept out of the refinement, which they would all hit).
    """
    return _refine(xs.left @ ys.right.T, xs, ys, diag)


# Relative size d^2 / (|x|^2 + |y|^2) below which the Gram form is recomputed directly:
# there its relative error, about 2 eps (|x|^2 + |y|^2) / d^2, would exceed ~1e-5.
_REFINE_BELOW = {torch.float32: 1e-2, torch.float64: 1e-10}
_REFINE_CHUNK = 1 << 22  # elements of x - y held at once


def _refine(sq: torch.Tensor, xs: _Side, ys: _Side, diag: int | None = None) -> torch.Tensor:
    """In place: recompute, from the uncentered points, entries dominated by rounding."""
    tau = _REFINE_BELOW.get(sq.dtype, 1e-2)
    thr = tau * (xs.sq + ys.sq.max())  # conservative per-row bound of tau * (|x_i|^2 + |y_j|^2)
    if diag is not None:
        sq[:, diag : diag + len(sq)].fill_diagonal_(float("inf"))
    rows = torch.nonzero(sq.amin(dim=1) < thr).flatten()  # a reduction first: usually no row qualifies
    if rows.numel():
        # then the exact per-pair bound: with one far outlier the row bound would flag nearly every pair
        # (token activations: 18 s of refinement for one 4096-point matrix instead of a few ms)
        bound = tau * (xs.sq[rows].unsqueeze(1) + ys.sq.unsqueeze(0))
        i, j = torch.nonzero(sq[rows] < bound, as_tuple=True)
        i = rows[i]
        step = max(1, _REFINE_CHUNK // max(1, xs.raw.shape[1]))
        for s in range(0, i.numel(), step):
            a, b = i[s : s + step], j[s : s + step]
            diff = xs.raw[a] - ys.raw[b]
            sq[a, b] = (diff * diff).sum(1).to(sq.dtype)
    if diag is not None:
        sq[:, diag : diag + len(sq)].fill_diagonal_(0)
    return sq


def _use_triton(X: torch.Tensor, backend: str) -> bool:
    if backend == "torch":
        return False
    if backend == "triton":
        if not triton_distances.is_available():
            raise WorkbenchError("backend='triton' needs triton installed: pip install 'workbench[triton]'")
        if not X.is_cuda and not triton_distances.interpret_mode():
            raise WorkbenchError(
                "backend='triton' on CPU tensors needs TRITON_INTERPRET=1 (or move the points to CUDA)"
            )
        return True
    if backend != "auto":
        raise WorkbenchError(f"unknown backend {backend!r}; use 'auto', 'torch' or 'triton'")
    return X.is_cuda and X.dtype == torch.float32 and triton_distances.is_available()


def pairwise_distances(
    X, Y=None, metric: Metric = "euclidean", block_size: int | None = None, backend: Backend = "auto"
):
    """Dense distance matrix between the rows of ``X`` and ``Y`` (``X`` itself when ``Y`` is None).

    ``block_size`` bounds the rows computed at once on the torch path (temporary memory
    is ``block_size * n``); for matrices that do not fit at all use ``iter_distance_blocks``,
    ``radius_edges`` or ``knn``.
    """
    Xt, was_numpy = _to_tensor(X)
    Yt = None if Y is None else _to_tensor(Y)[0]
    xs, ys = _prepare(Xt, Yt, metric)
    if _use_triton(xs.c, backend):
        xs = xs.float()
        ys = xs if ys is None else ys.float()
        sym = ys is xs
        out = triton_distances.sqdist(xs.c, ys.c, xs.sq, ys.sq, symmetric=sym)
        return _out(_finish(_refine(out, xs, ys, 0 if sym else None), metric), was_numpy)
    if ys is None:
        out = _symmetric_torch(xs, block_size or DEFAULT_BLOCK)
    else:
        bs = block_size or DEFAULT_BLOCK
        out = torch.empty((len(xs.c), len(ys.c)), dtype=xs.c.dtype, device=xs.c.device)
        for s in range(0, len(xs.c), bs):
            out[s : s + bs] = _sq_block(xs.rows(s, s + bs), ys)
    return _out(_finish(out, metric), was_numpy)


def _symmetric_torch(xs: _Side, bs: int) -> torch.Tensor:
    """Squared self-distances: upper block-triangle by GEMM, mirrored (half the FLOPs, exact symmetry).

    Each GEMM writes straight into the output (no temporaries); the diagonal tile is
    symmetrised from its upper triangle, the rest of the lower triangle is a transposed copy.
    """
    n = len(xs.c)
    out = torch.empty((n, n), dtype=xs.c.dtype, device=xs.c.device)
    for s in range(0, n, bs):
        e = min(s + bs, n)
        row = out[s:e, s:]
        torch.mm(xs.left[s:e], xs.right[s:].T, out=row)
        _refine(row, xs.rows(s, e), xs.rows(s), diag=0)
        upper = row[:, : e - s].triu(1)
        torch.add(upper, upper.T, out=row[:, : e - s])  # exact symmetry inside the diagonal tile
        out[e:, s:e] = row[:, e - s :].T
    return out


def iter_distance_blocks(
    X, Y=None, metric: Metric = "euclidean", block_size: int | None = None, backend: Backend = "auto"
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """Yield ``(start, stop, D[start:stop])`` row blocks of the distance matrix as tensors.

    Memory is ``block_size * len(Y)``; the n x n matrix never exists. For self-distances the
    diagonal entries are exactly 0.
    """
    Xt, _ = _to_tensor(X)
    Yt = None if Y is None else _to_tensor(Y)[0]
    xs, ys = _prepare(Xt, Yt, metric)
    self_mode = ys is None
    if self_mode:
        ys = xs
    triton = _use_triton(xs.c, backend)
    if triton:
        xs, ys = xs.float(), ys.float()
    bs = block_size or DEFAULT_BLOCK
    for s in range(0, len(xs.c), bs):
        e = min(s + bs, len(xs.c))
        xb = xs.rows(s, e)
        diag = s if self_mode else None
        if triton:
            blk = _refine(triton_distances.sqdist(xb.c, ys.c, xb.sq, ys.sq), xb, ys, diag)
        else:
            blk = _sq_block(xb, ys, diag)
        yield s, e, _finish(blk, metric)


def radius_edges(
    X, radius: float, metric: Metric = "euclidean", block_size: int | None = None, backend: Backend = "auto"
):
    """Sparse edge list ``(i, j, d)`` with ``i < j`` of all pairs at distance ``<= radius``.

    What a thresholded Rips complex needs, without the dense matrix. NumPy arrays out.
    """
    rows, cols, dists = [], [], []
    for s, _e, blk in iter_distance_blocks(X, None, metric, block_size, backend):
        i, j = torch.nonzero(blk <= radius, as_tuple=True)
        i = i + s
        keep = i < j
        i, j = i[keep], j[keep]
        rows.append(i.cpu())
        cols.append(j.cpu())
        dists.append(blk[i - s, j].cpu())
    cat = lambda parts, dt: torch.cat(parts).numpy() if parts else np.empty(0, dt)  # noqa: E731
    return cat(rows, np.int64), cat(cols, np.int64), cat(dists, np.float32)


def knn(
    X, k: int, Y=None, metric: Metric = "euclidean", block_size: int | None = None, backend: Backend = "auto"
):
    """The ``k`` nearest rows of ``Y`` (of ``X`` itself, excluding each point) for every row of ``X``.

    Returns ``(indices, distances)``, both ``(n, k)``, sorted by distance, as NumPy arrays.
    Self-neighbours on the torch path use each GEMM tile twice (for its rows and, transposed,
    for its columns), so only the upper block-triangle is computed: half the FLOPs.
    """
    self_mode = Y is None
    m = len(X) if self_mode else len(Y)
    available = m - 1 if self_mode else m
    if not 1 <= k <= available:
        raise WorkbenchError(f"k={k} nearest neighbours asked, but only {available} candidates exist")
    Xt, _ = _to_tensor(X)
    if self_mode and not _use_triton(Xt, backend):
        return _knn_self_torch(Xt, k, metric, block_size or DEFAULT_BLOCK)
    idx, dist = [], []
    for s, e, blk in iter_distance_blocks(X, Y, metric, block_size, backend):
        if self_mode:
            blk[:, s:e].fill_diagonal_(float("inf"))
        d, i = torch.topk(blk, k, dim=1, largest=False, sorted=True)
        idx.append(i.cpu())
        dist.append(d.cpu())
    return torch.cat(idx).numpy(), torch.cat(dist).numpy()


def _knn_self_torch(X: torch.Tensor, k: int, metric: str, bs: int):
    """Self k-nearest neighbours from the upper block-triangle of squared distances."""
    xs, _ = _prepare(X, None, metric)
    n = len(xs.c)
    inf = float("inf")
    best_d = torch.full((n, k), inf, dtype=xs.c.dtype)
    best_i = torch.zeros((n, k), dtype=torch.int64)

    def merge(rows: slice, d: torch.Tensor, i: torch.Tensor) -> None:
        dd = torch.cat([best_d[rows], d], 1)
        ii = torch.cat([best_i[rows], i], 1)
        top, pos = torch.topk(dd, k, dim=1, largest=False, sorted=True)
        best_d[rows], best_i[rows] = top, torch.gather(ii, 1, pos)

    for s in range(0, n, bs):
        e = min(s + bs, n)
        blk = _sq_block(xs.rows(s, e), xs.rows(s), diag=0)  # rows s:e, columns s:n
        blk[:, : e - s].fill_diagonal_(inf)
        d, i = torch.topk(blk, min(k, blk.shape[1]), dim=1, largest=False, sorted=True)
        merge(slice(s, e), d, i + s)
        if e < n:  # the same tile, transposed, offers rows e:n their neighbours among s:e
            t = blk[:, e - s :].T.contiguous()
            d, i = torch.topk(t, min(k, e - s), dim=1, largest=False, sorted=True)
            merge(slice(e, n), d, i + s)
    return best_i.numpy(), _finish(best_d, metric).numpy()


def maxmin_subsample(X, m: int, metric: Metric = "euclidean", start: int = 0):
    """Farthest-point (maxmin) landmarks: ``m`` indices, each the farthest from those before it.

    Returns ``(indices, radius)`` where ``radius`` is the Hausdorff distance between the cloud
    and the landmarks (every point lies within ``radius`` of a landmark), so Rips diagrams of
    the landmarks are within bottleneck distance ``2 * radius`` of the full cloud's.
    Costs ``m`` matrix-vector products; the distance matrix is never formed.
    """
    Xt, _ = _to_tensor(X)
    n = Xt.shape[0]
    if not 1 <= m <= n:
        raise WorkbenchError(f"{m} landmarks asked from {n} points; use 1 <= landmarks <= {n}")
    xs, _ = _prepare(Xt, None, metric)
    Xc, xx = xs.c, xs.sq
    idx = []
    mins = torch.full((n,), float("inf"), dtype=Xc.dtype, device=Xc.device)
    sq = torch.empty_like(mins)
    j = start
    for _ in range(m):
        idx.append(j)
        torch.mv(Xc, Xc[j], out=sq)
        sq.mul_(-2).add_(xx).add_(xx[j])
        torch.minimum(mins, sq, out=mins)
        mins[j] = 0
        j = int(torch.argmax(mins))
    radius = _finish(mins.max().reshape(1), metric)
    return np.asarray(idx, dtype=np.int64), float(radius[0])
