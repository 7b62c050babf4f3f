"""Vietoris–Rips (and Alpha) persistence of point clouds.

Diagrams follow ripser.py: a list with one ``(n_i, 2)`` float64 array of (birth, death)
pairs per homology dimension. Classes alive at the end of the filtration have death
``np.inf``: always one in H0 (the whole cloud), more when ``thresh`` cuts the filtration.
Zero-length bars (duplicate points, simultaneous edges) are dropped, as ripser does.

H0 is computed from the minimum spanning tree (its edge lengths are exactly the H0 deaths)
and never goes through ripser: dense Prim up to ``DENSE_H0_MAX`` points, above that a
Borůvka variant over cached k-nearest-neighbour lists that never holds the n x n matrix.
H1 and up go to giotto-ph (threads) on a distance matrix from ``workbench.kernels``, ripser as fallback.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field

import numpy as np

from workbench.errors import WorkbenchError
from workbench.topology.validate import as_points, check_rips_size

log = logging.getLogger(__name__)

DENSE_H0_MAX = 8192  # n^2 float32 = 268 MB


@dataclass
class PersistenceResult:
    """Diagrams plus what is needed to read them honestly.

    ``hausdorff`` is the distance from the cloud to the landmarks that were used (0 for the
    full cloud); the diagrams are within bottleneck distance ``bottleneck_bound = 2 * hausdorff``
    of the full cloud's Rips diagrams (Chazal et al. 2009 stability).
    """

    dgms: list[np.ndarray]
    metric: str
    n_points: int
    thresh: float = math.inf
    landmarks: np.ndarray | None = None
    hausdorff: float = 0.0
    backend: str = ""
    complex: str = "rips"
    extras: dict = field(default_factory=dict)

    @property
    def maxdim(self) -> int:
        return len(self.dgms) - 1

    @property
    def bottleneck_bound(self) -> float:
        return 2.0 * self.hausdorff


def _diagram_from_deaths(deaths: np.ndarray, thresh: float = math.inf) -> np.ndarray:
    """H0 diagram from MST edge lengths: zero bars dropped, edges above ``thresh`` never join."""
    deaths = np.sort(np.asarray(deaths, dtype=np.float64))
    finite = deaths[(deaths > 0) & (deaths <= thresh)]
    n_essential = 1 + int(np.count_nonzero(deaths > thresh))
    dgm = np.zeros((finite.size + n_essential, 2))
    dgm[: finite.size, 1] = finite
    dgm[finite.size :, 1] = np.inf
    return dgm


def mst_weights_dense(D: np.ndarray) -> np.ndarray:
    """Edge lengths of a minimum spanning tree of a dense distance matrix (Prim, O(n^2)).

    Each step is three contiguous passes in D's own dtype (no casts, no gathers): add the
    in-tree penalty, argmin, and fold the new vertex's row into the best-edge array.
    """
    D = np.asarray(D)
    n = D.shape[0]
    best = D[0].copy()
    penalty = np.zeros(n, dtype=D.dtype)
    penalty[0] = np.inf
    scratch = np.empty(n, dtype=D.dtype)
    out = np.empty(n - 1)
    for t in range(n - 1):
        np.add(best, penalty, out=scratch)
        j = int(np.argmin(scratch))
        out[t] = best[j]
        penalty[j] = np.inf
        np.minimum(best, D[j], out=best)
    return out


def mst_weights_blocked(X, metric: str = "euclidean", k: int = 16, block_size: int = 1024) -> np.ndarray:
    """MST edge lengths without an n x n matrix: Borůvka over cached k-nearest lists.

    Each point keeps its k nearest points outside its component (sorted). A component's
    cheapest outgoing edge is the best first-outside entry over its points, unless some
    point's list is used up and its k-th distance (a lower bound) is smaller: only those
    points are rescanned against the whole cloud, in blocks. Exact; memory O(n k + block n).
    """
    import torch
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    from workbench.kernels import iter_distance_blocks, knn

    n = len(X)
    k = min(k, n - 1)
    nbr, nd = knn(X, k, metric=metric, block_size=block_size)
    nd = nd.astype(np.float64)
    label = np.arange(n)
    ei, ej, ew = [], [], []
    rows = np.arange(n)
    while True:
        n_comp = int(label.max()) + 1
        if n_comp == 1:
            break
        first, cand, used_up = _first_outside(nbr, nd, label)
        best = np.full(n_comp, np.inf)
        np.minimum.at(best, label, cand)
        lower = np.where(used_up, nd[:, -1], np.inf)
        redo = np.flatnonzero(used_up & (lower < best[label]))
        if redo.size:
            log.debug("boruvka: %d components, rescanning %d points", n_comp, redo.size)
            lab_t = torch.from_numpy(label)
            for s, e, blk in iter_distance_blocks(X[redo], X, metric=metric, block_size=block_size):
                q = torch.from_numpy(redo[s:e])
                blk[lab_t[q].unsqueeze(1) == lab_t.unsqueeze(0)] = float("inf")
                d, i = torch.topk(blk, k, dim=1, largest=False, sorted=True)
                nbr[redo[s:e]], nd[redo[s:e]] = i.numpy(), d.double().numpy()
            first, cand, used_up = _first_outside(nbr, nd, label)
            best = np.full(n_comp, np.inf)
            np.minimum.at(best, label, cand)
        if not np.isfinite(best).all():  # cannot happen for finite data, guards an endless loop
            raise WorkbenchError(
                "minimum spanning tree: a component found no outgoing edge (non-finite distances?)"
            )
        # One winning point per component: the first point attaining the component's best.
        win = cand == best[label]
        order = np.flatnonzero(win)
        _, pick = np.unique(label[order], return_index=True)
        src = order[pick]
        dst = nbr[src, first[src]]
        ei.append(src)
        ej.append(dst)
        ew.append(cand[src])
        all_i, all_j = np.concatenate(ei), np.concatenate(ej)
        graph = coo_matrix((np.ones(all_i.size), (all_i, all_j)), shape=(n, n))
        _, label = connected_components(graph, directed=False)
    # Ties can make two components pick edges that close a cycle; Kruskal over the chosen
    # edges keeps a spanning tree with the same (minimum) weights.
    return _kruskal(n, np.concatenate(ei), np.concatenate(ej), np.concatenate(ew), rows)


def _first_outside(nbr: np.ndarray, nd: np.ndarray, label: np.ndarray):
    """Per point: position of the first cached neighbour in another component, its distance, used-up flag."""
    outside = label[nbr] != label[:, None]
    first = np.argmax(outside, axis=1)
    used_up = ~outside[np.arange(len(nbr)), first]
    cand = np.where(used_up, np.inf, nd[np.arange(len(nbr)), first])
    return first, cand, used_up


def _kruskal(n: int, i: np.ndarray, j: np.ndarray, w: np.ndarray, rows: np.ndarray) -> np.ndarray:
    parent = rows.copy()

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    out = []
    for t in np.argsort(w, kind="stable"):
        a, b = find(i[t]), find(j[t])
        if a != b:
            parent[a] = b
            out.append(w[t])
    if len(out) != n - 1:
        raise WorkbenchError(f"minimum spanning tree has {len(out)} edges for {n} points; please report this")
    return np.asarray(out)


def h0_persistence(
    X, metric: str = "euclidean", thresh: float = math.inf, method: str = "auto", device: str | None = None
) -> np.ndarray:
    """The H0 Rips diagram of a cloud from its minimum spanning tree (equals ripser's H0).

    ``method``: "dense" (Prim on the full matrix), "blocked" (Borůvka, no n x n matrix) or
    "auto" (dense up to ``DENSE_H0_MAX`` points). ``device="cuda"`` computes the distance
    matrix there (Triton kernel).
    """
    X = as_points(X)
    if method == "auto":
        method = "dense" if len(X) <= DENSE_H0_MAX else "blocked"
    if method == "dense":
        deaths = mst_weights_dense(dense_distances(_float(X), metric, device))
    elif method == "blocked":
        deaths = mst_weights_blocked(_float(X), metric=metric)
    else:
        raise WorkbenchError(f"unknown H0 method {method!r}; use 'auto', 'dense' or 'blocked'")
    return _diagram_from_deaths(deaths, thresh)


def dense_distances(P: np.ndarray, metric: str, device: str | None = None) -> np.ndarray:
    """The distance matrix as NumPy, computed on ``device`` (a torch device name) when given."""
    from workbench.kernels import pairwise_distances

    if device is None:
        return pairwise_distances(P, metric=metric)
    import torch

    return pairwise_distances(torch.from_numpy(P).to(device), metric=metric).cpu().numpy()


def _float(X: np.ndarray) -> np.ndarray:
    """float32 unless the caller chose float64: distances are GEMMs, float32 is the fast path."""
    return X if X.dtype in (np.float32, np.float64) else X.astype(np.float32)


def rips_persistence(
    X,
    maxdim: int = 1,
    metric: str = "euclidean",
    thresh: float = math.inf,
    landmarks: int | None = None,
    n_threads: int | None = None,
    backend: str = "auto",
    max_points: int | None = None,
    distance_matrix: bool = False,
    landmark_method: str = "random",
    seed: int = 0,
    device: str | None = None,
    full_h0: bool = False,
) -> PersistenceResult:
    """Vietoris–Rips persistence up to H``maxdim`` of a point cloud (or a distance matrix).

    ``landmarks=m`` runs on m landmarks and reports the Hausdorff error bound; they are
    chosen by ``landmark_method``: "random" (uniform, ``seed``; the default) or "maxmin"
    (farthest-point: a somewhat smaller bound, and it keeps small far clusters, but on
    high-dimensional clouds it picks the extreme, nearly equidistant points, the worst case
    for Rips H1: 4096 isotropic points in 576 dims, 1024 landmarks, H1 took 398 s with
    maxmin vs 1.4 s random, at equal measured bottleneck error; see bench/bench_h1.py);
    ``thresh`` stops the filtration at that scale (longer classes get death inf);
    ``backend``: "giotto" (giotto-ph, threaded), "ripser", or "auto" (giotto-ph when installed).
    H0 always comes from the minimum spanning tree. Clouds too large for a full complex
    raise a WorkbenchError proposing landmarks or a threshold (``max_points`` overrides the limit).
    ``device="cuda"`` computes the distance matrix on the GPU (Triton kernel).
    ``full_h0=True`` with landmarks takes H0 from the whole cloud's minimum spanning tree
    (exact; landmark H0 is far off: fewer points, longer edges), so the error bound then
    concerns H1 and up only (``extras["h0"] == "full cloud"``).
    """
    if maxdim < 0:
        raise WorkbenchError(f"maxdim must be >= 0; got {maxdim}")
    thresh = math.inf if thresh is None else float(thresh)
    if not thresh > 0:  # NaN compares false: it would cut every edge and give one bar per point
        raise WorkbenchError(f"thresh must be a positive distance (or omitted for no threshold); got {thresh}")
    if distance_matrix:
        D = _as_distance_matrix(X)
        n_points = len(D)
        if landmarks is not None:
            raise WorkbenchError("landmarks need the points, not a distance matrix; pass the cloud instead")
    else:
        P = _float(as_points(X))
        n_points = len(P)
    idx, radius = None, 0.0
    full = None if distance_matrix else P
    if landmarks is not None and landmarks < n_points:
        idx, radius = choose_landmarks(P, int(landmarks), landmark_method, metric, seed)
        P = P[idx]
    n = len(D) if distance_matrix else len(P)
    check_rips_size(n, maxdim, thresh, max_points)

    def result(dgms: list[np.ndarray], used: str) -> PersistenceResult:
        extras = {}
        if full_h0 and idx is not None:  # H0 of the whole cloud: exact, and cheap from its MST
            dgms = [h0_persistence(full, metric, thresh, device=device), *dgms[1:]]
            extras["h0"] = "full cloud"
        return PersistenceResult(dgms, metric, n_points, thresh, idx, radius, used, extras=extras)

    if not distance_matrix and n > DENSE_H0_MAX:  # never the n x n matrix
        dgm0 = _diagram_from_deaths(mst_weights_blocked(P, metric=metric), thresh)
        if maxdim == 0:
            return result([dgm0], "mst-blocked")
        # check_rips_size let a large cloud through only with a finite threshold: sparse edges.
        D = _sparse_distances(P, thresh, metric)
        dgms, used = _ripser_family(D, maxdim, thresh, n_threads, backend)
        return result([dgm0, *dgms[1:]], used + "-sparse")
    if not distance_matrix:
        D = dense_distances(P, metric, device)
    dgm0 = _diagram_from_deaths(mst_weights_dense(D), thresh)
    if maxdim == 0:
        return result([dgm0], "mst")
    dgms, used = _ripser_family(D, maxdim, thresh, n_threads, backend)
    return result([dgm0, *dgms[1:]], used)


def choose_landmarks(P, m: int, method: str = "maxmin", metric: str = "euclidean", seed: int = 0):
    """``(indices, hausdorff)``: m landmark rows and the largest distance from a point to its nearest landmark."""
    from workbench.kernels import knn, maxmin_subsample

    if method == "maxmin":
        return maxmin_subsample(P, m, metric=metric, start=int(np.random.default_rng(seed).integers(len(P))))
    if method != "random":
        raise WorkbenchError(f"unknown landmark_method {method!r}; use 'maxmin' or 'random'")
    if not 1 <= m <= len(P):
        raise WorkbenchError(f"{m} landmarks asked from {len(P)} points; use 1 <= landmarks <= {len(P)}")
    idx = np.sort(np.random.default_rng(seed).choice(len(P), size=m, replace=False))
    _, nearest = knn(P, 1, Y=P[idx], metric=metric)
    return idx, float(nearest.max())


def _sparse_distances(P: np.ndarray, thresh: float, metric: str):
    """Upper-triangular sparse matrix of the edges no longer than ``thresh`` (absent = infinite)."""
    from scipy.sparse import coo_matrix

    from workbench.kernels import radius_edges

    i, j, d = radius_edges(P, thresh, metric=metric)
    log.info("sparse Rips: %d edges below thresh=%g among %d points", d.size, thresh, len(P))
    # an explicit zero diagonal keeps every vertex in the complex
    diag = np.arange(len(P))
    rows, cols = np.concatenate([i, diag]), np.concatenate([j, diag])
    vals = np.concatenate([d.astype(np.float64), np.zeros(len(P))])
    return coo_matrix((vals, (rows, cols)), shape=(len(P), len(P)))


def _as_distance_matrix(D) -> np.ndarray:
    D = np.asarray(D, dtype=np.float64)
    if D.ndim != 2 or D.shape[0] != D.shape[1]:
        raise WorkbenchError(f"a distance matrix must be square; got shape {D.shape}")
    if len(D) < 3:
        raise WorkbenchError(f"distance matrix has {len(D)} point(s); persistent homology needs at least 3")
    if not np.isfinite(D).all():
        bad = np.flatnonzero(~np.isfinite(D).all(axis=1))
        raise WorkbenchError(
            f"distance matrix has NaN/inf in rows {bad[:10].tolist()}; use thresh for cut-offs instead"
        )
    if np.any(np.diag(D) != 0) or not np.allclose(D, D.T) or np.any(D < 0):
        raise WorkbenchError("a distance matrix must be symmetric, non-negative, with a zero diagonal")
    return D


def _ripser_family(D: np.ndarray, maxdim: int, thresh: float, n_threads: int | None, backend: str):
    """Diagrams from giotto-ph or ripser on a precomputed matrix, as float64 arrays."""
    if backend not in ("auto", "giotto", "ripser"):
        raise WorkbenchError(f"unknown backend {backend!r}; use 'auto', 'giotto' or 'ripser'")
    if backend in ("auto", "giotto"):
        try:
            from gph import ripser_parallel
        except ImportError:
            if backend == "giotto":
                raise WorkbenchError("backend='giotto' needs giotto-ph: pip install giotto-ph") from None
        else:
            threads = n_threads or os.cpu_count() or 1
            # collapse_edges stays off: on high-dimensional clouds it costs far more than it saves.
            out = ripser_parallel(D, maxdim=maxdim, thresh=thresh, metric="precomputed", n_threads=threads)
            return [np.asarray(d, dtype=np.float64).reshape(-1, 2) for d in out["dgms"]], "giotto-ph"
    from ripser import ripser

    out = ripser(D, maxdim=maxdim, thresh=thresh, distance_matrix=True)
    return [np.asarray(d, dtype=np.float64).reshape(-1, 2) for d in out["dgms"]], "ripser"


def alpha_persistence(X, maxdim: int = 1, scale: str = "diameter") -> PersistenceResult:
    """Persistence of the Alpha complex (gudhi) of a low-dimensional cloud: fast, Čech-type.

    gudhi's filtration values are squared radii; ``scale="radius"`` returns their square
    roots, ``scale="diameter"`` (default) twice that, which puts H0 exactly on the Rips
    scale (H0 deaths = MST edge lengths) and H1 on a comparable one. For 2-D neuron clouds
    of thousands of points this is ~100x faster than Rips.
    """
    import gudhi

    X = as_points(X)
    if X.shape[1] > 3:
        raise WorkbenchError(
            f"Alpha complexes are for clouds of dimension <= 3 (got {X.shape[1]}); use rips_persistence"
        )
    if scale not in ("diameter", "radius"):
        raise WorkbenchError(f"unknown scale {scale!r}; use 'diameter' or 'radius'")
    st = gudhi.AlphaComplex(points=X.astype(np.float64)).create_simplex_tree()
    st.compute_persistence(min_persistence=0.0, persistence_dim_max=True)
    factor = 2.0 if scale == "diameter" else 1.0
    dgms = []
    for dim in range(maxdim + 1):
        iv = np.asarray(st.persistence_intervals_in_dimension(dim), dtype=np.float64).reshape(-1, 2)
        iv = factor * np.sqrt(np.maximum(iv, 0))
        # Cospherical points give bars whose ends differ by rounding only: drop those too.
        iv = iv[iv[:, 1] - iv[:, 0] > 1e-9 * np.maximum(1.0, np.abs(iv[:, 0]))]
        dgms.append(iv[np.lexsort((iv[:, 0], iv[:, 1]))])
    return PersistenceResult(dgms, "euclidean", len(X), backend="gudhi-alpha", complex="alpha")
