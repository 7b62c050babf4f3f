"""Pairwise distances between point sets: dense, tiled, thresholded and k-nearest.

A distance matrix is a GEMM (``|x|^2 + |y|^2 - 2 x.y``), which is fast but loses
precision when the points sit far from the origin: both sets are centered on their
common mean first (distances do not change, the cancellation goes away). Cosine distance
is computed as ``|x/|x| - y/|y||^2 / 2`` through the same path, which keeps it accurate for
nearly parallel vectors. Self-distances are exactly symmetric with an exact zero diagonal.

CUDA float32/float16 tensors go through the Triton kernel (``kernels.triton_distances``);
everything else through torch. ``backend="triton"`` forces the kernel (on CPU tensors it
needs ``TRITON_INTERPRET=1``). NumPy inputs give NumPy outputs, tensors give tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import numpy as np
import torch

from kernels import triton_distances
from workbench.errors import WorkbenchError

Metric = Literal["euclidean", "sqeuclidean", "cosine"]
Backend = Literal["auto", "torch", "triton"]
METRICS = ("euclidean", "sqeuclidean", "cosine")
DEFAULT_BLOCK = 2048


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


def _prepare(X: torch.Tensor, Y: torch.Tensor | None, metric: str):
    """Centered (or normalised-then-centered) copies and their squared norms."""
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
    Xc = (X - mu).contiguous()
    Yc = None if Y is None else (Y - mu).contiguous()
    xx = (Xc * Xc).sum(1)
    yy = None if Yc is None else (Yc * Yc).sum(1)
    return Xc, Yc, xx, yy


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


def _sq_block(xb: torch.Tensor, xxb: torch.Tensor, Yc: torch.Tensor, yy: torch.Tensor) -> torch.Tensor:
    """Squared distances of a row block to all columns (torch path, unclamped)."""
    out = torch.addmm(yy.unsqueeze(0), xb, Yc.T, beta=1, alpha=-2)
    out.add_(xxb.unsqueeze(1))
    return out


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
    Xc, Yc, xx, yy = _prepare(Xt, Yt, metric)
    if _use_triton(Xc, backend):
        squared = metric != "euclidean"
        out = triton_distances.sqdist(
            Xc.float(), (Xc if Yc is None else Yc).float(), xx.float(), (xx if yy is None else yy).float(),
            symmetric=Yc is None, sqrt=not squared,
        )  # fmt: skip
        if metric == "cosine":
            out.mul_(0.5)
        return _out(out, was_numpy)
    if Yc is None:
        out = _symmetric_torch(Xc, xx, block_size or DEFAULT_BLOCK)
    else:
        bs = block_size or DEFAULT_BLOCK
        out = torch.empty((Xc.shape[0], Yc.shape[0]), dtype=Xc.dtype, device=Xc.device)
        for s in range(0, Xc.shape[0], bs):
            out[s : s + bs] = _sq_block(Xc[s : s + bs], xx[s : s + bs], Yc, yy)
    return _out(_finish(out, metric), was_numpy)


def _symmetric_torch(Xc: torch.Tensor, xx: torch.Tensor, bs: int) -> torch.Tensor:
    """Squared self-distances: upper block-triangle by GEMM, mirrored (half the FLOPs, exact symmetry)."""
    n = Xc.shape[0]
    out = torch.empty((n, n), dtype=Xc.dtype, device=Xc.device)
    for s in range(0, n, bs):
        e = min(s + bs, n)
        row = torch.addmm(xx[s:].unsqueeze(0), Xc[s:e], Xc[s:].T, beta=1, alpha=-2)
        row.add_(xx[s:e].unsqueeze(1))
        diag = row[:, : e - s]
        diag.copy_(torch.triu(diag, 1) + torch.triu(diag, 1).T)  # zero diagonal, exact symmetry
        out[s:e, s:] = row
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
    Xc, Yc, xx, yy = _prepare(Xt, Yt, metric)
    self_mode = Yc is None
    if self_mode:
        Yc, yy = Xc, xx
    triton = _use_triton(Xc, backend)
    bs = block_size or DEFAULT_BLOCK
    for s in range(0, Xc.shape[0], bs):
        e = min(s + bs, Xc.shape[0])
        if triton:
            blk = triton_distances.sqdist(Xc[s:e].float(), Yc.float(), xx[s:e].float(), yy.float())
        else:
            blk = _sq_block(Xc[s:e], xx[s:e], Yc, yy)
        if self_mode:
            blk[:, s:e].fill_diagonal_(0)
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
    """
    self_mode = Y is None
    m = len(X) if self_mode else len(Y)
    available = m - 1 if self_mode else m
    if not 1 <= k <= available:
        raise WorkbenchError(f"k={k} nearest neighbours asked, but only {available} candidates exist")
    idx, dist = [], []
    for s, e, blk in iter_distance_blocks(X, Y, metric, block_size, backend):
        if self_mode:
            blk[:, s:e].fill_diagonal_(float("inf"))
        d, i = torch.topk(blk, k, dim=1, largest=False, sorted=True)
        idx.append(i.cpu())
        dist.append(d.cpu())
    return torch.cat(idx).numpy(), torch.cat(dist).numpy()
