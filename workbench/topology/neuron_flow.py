"""Neuron-level information flow: topology of (layer l, layer l') activation pairs.

For one input and two layers of equal width D, neuron i is the 2-D point
``(v_i^l, v_i^l')``; the cloud of D such points carries how the representation at l is
carried to l'. Its total H1 persistence, per sample and averaged per condition, as a
curve over layer pairs at fixed gaps (1, 3, 10), is the reference study's flow signal.
The control: shuffling neuron indices of l' within each sample keeps both marginals and
destroys the pairing, so a difference that survives the shuffle is not flow.

The Alpha complex (gudhi) is the default: exact for 2-D clouds and ~100x faster than
Rips on thousands of points; ``method="rips"`` gives the Vietoris-Rips value instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from workbench.errors import WorkbenchError

log = logging.getLogger(__name__)


def neuron_cloud(v_l, v_lp) -> np.ndarray:
    """The (D, 2) cloud of neuron-wise pairs from two activation vectors of one input."""
    a, b = np.asarray(v_l, dtype=np.float64).ravel(), np.asarray(v_lp, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise WorkbenchError(
            f"layers have different widths ({a.size} vs {b.size}); neuron pairs need equal widths"
        )
    return np.stack([a, b], axis=1)


def total_h1_persistence(cloud: np.ndarray, method: str = "alpha") -> float:
    """Sum of finite H1 lifetimes of a 2-D cloud (diameter scale); 0 for fewer than 3 distinct points."""
    from workbench.topology.persistence import alpha_persistence, rips_persistence

    if method not in ("alpha", "rips"):
        raise WorkbenchError(f"unknown method {method!r}; use 'alpha' or 'rips'")
    X = np.asarray(cloud)
    if (method == "alpha" and X.ndim == 2 and X.shape[1] == 2 and np.issubdtype(X.dtype, np.number)
            and np.isfinite(X).all()):
        return alpha_total_h1(X)  # the planar case, the flow's: no pairing needed
    if len(np.unique(X, axis=0)) < 3:
        return 0.0
    # anything else (another dimension, NaN, ...) goes through the validated diagram path, which says what is wrong
    diagrams = alpha_persistence(X, maxdim=1) if method == "alpha" else rips_persistence(X, maxdim=1, n_threads=1)
    dgm = diagrams.dgms[1]
    finite = dgm[np.isfinite(dgm[:, 1])]
    return float((finite[:, 1] - finite[:, 0]).sum())


def alpha_total_h1(cloud: np.ndarray) -> float:
    """Total H1 persistence of the Alpha complex of a planar cloud, on ``alpha_persistence``'s diameter scale,
    without pairing a single bar.

    The Delaunay triangulation is contractible and planar, so every triangle kills an H1 class (none can
    create H2) and every edge either joins two components (a minimum-spanning-tree edge) or creates a
    class. Hence total H1 = sum of triangle values - sum of edge values + sum of MST edge values, whatever
    the pairing. Values are gudhi's: a triangle's squared circumradius; an edge's squared half-length when no
    opposite vertex lies inside its diametral circle (Gabriel), else the smallest of its triangles' values.
    Equal to the gudhi diagrams' sum within 1e-8 relative (tests), 1.5-2.4x faster: the flow runs thousands."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import minimum_spanning_tree
    from scipy.spatial import Delaunay, QhullError

    P = np.asarray(cloud, dtype=np.float64)
    if P.ndim != 2 or P.shape[1] != 2 or not np.isfinite(P).all():
        raise WorkbenchError(f"alpha_total_h1 needs a finite (n, 2) cloud; got shape {P.shape} "
                             f"{'' if np.isfinite(P).all() else 'with NaN/inf values'}: use total_h1_persistence")
    try:
        tri = Delaunay(P)  # repeated points are left out of the triangulation, as gudhi leaves them
    except (QhullError, ValueError):  # fewer than 3 distinct points, or all on one line: no triangle, no H1
        return 0.0
    T, nbr = tri.simplices, tri.neighbors
    a, b, c = P[T[:, 0]], P[T[:, 1]], P[T[:, 2]]
    ab, ac, bc = b - a, c - a, c - b
    cross = ab[:, 0] * ac[:, 1] - ab[:, 1] * ac[:, 0]
    f_tri = (bc * bc).sum(1) * (ac * ac).sum(1) * (ab * ab).sum(1) / (4 * cross * cross)
    # edge k of triangle t is the one opposite its vertex k; an inner edge is listed by both its triangles
    ends = np.stack([T[:, [1, 2]], T[:, [0, 2]], T[:, [0, 1]]], axis=1)  # (n_tri, 3, 2)
    p, q, r = P[ends[..., 0]], P[ends[..., 1]], P[T]
    attached = ((p - r) * (q - r)).sum(-1) < 0  # the opposite vertex sees the edge at an obtuse angle
    t_idx = np.broadcast_to(np.arange(len(T))[:, None], nbr.shape)
    first = (nbr < t_idx)  # keep each edge once: from the triangle of higher index, or its only one
    t, k = np.nonzero(first)
    s = nbr[t, k]
    inner = s >= 0
    k_s = np.argmax(nbr[s[inner]] == t[inner, None], axis=1)  # the same edge's slot in the neighbour
    att = attached[t, k].copy()
    att[inner] |= attached[s[inner], k_s]
    f_min = f_tri[t].copy()
    f_min[inner] = np.minimum(f_min[inner], f_tri[s[inner]])
    half = ((p[t, k] - q[t, k]) ** 2).sum(1) / 4
    f_edge = np.where(att, f_min, half)
    scale = lambda v: 2.0 * np.sqrt(np.maximum(v, 0.0))  # noqa: E731  gudhi's squared radii -> diameters
    w = scale(f_edge)
    u, v = ends[t, k, 0], ends[t, k, 1]
    tiny = np.finfo(np.float64).tiny  # csgraph reads a stored 0 as no edge
    mst = minimum_spanning_tree(coo_matrix((w + tiny, (u, v)), shape=(len(P), len(P))))
    return float(scale(f_tri).sum() - w.sum() + (mst.data - tiny).sum())


@dataclass
class FlowResult:
    """Total H1 persistence per layer pair and sample.

    ``totals[gap]`` has shape (n_pairs, n_samples); its rows follow ``pairs[gap]``, the
    (l, l + gap) pairs in order of l. ``layers`` are the layer labels the array axis had.
    """

    layers: list
    gaps: tuple[int, ...]
    pairs: dict[int, list[tuple]]
    totals: dict[int, np.ndarray]
    method: str
    permuted: bool

    def curve(self, gap: int) -> np.ndarray:
        """Mean over samples per layer pair: the curve over depth at this gap."""
        return self.totals[gap].mean(axis=1)

    def mean(self, gap: int) -> float:
        """Average over pairs and samples at this gap."""
        return float(self.totals[gap].mean())


def _stack(acts) -> tuple[np.ndarray, list]:
    """(n_samples, n_layers, D) array and layer labels from an array or a {layer: (n_samples, D)} mapping."""
    if isinstance(acts, Mapping):
        layers = list(acts)
        arr = np.stack([np.asarray(acts[k], dtype=np.float64) for k in layers], axis=1)
    else:
        arr = np.asarray(acts, dtype=np.float64)
        layers = list(range(arr.shape[1])) if arr.ndim == 3 else []
    if arr.ndim != 3:
        raise WorkbenchError(
            f"activations must be (n_samples, n_layers, width) or {{layer: (n_samples, width)}}; got shape {arr.shape}"
        )
    bad = np.flatnonzero(~np.isfinite(arr).all(axis=(1, 2)))
    if bad.size:
        raise WorkbenchError(
            f"activations of samples {bad[:10].tolist()} have NaN/inf values; drop those samples"
        )
    if arr.shape[2] < 3:
        raise WorkbenchError(
            f"layer width {arr.shape[2]} gives fewer than 3 neuron points; nothing to measure"
        )
    return arr, layers


def neuron_flow(
    acts,
    gaps: Iterable[int] = (1, 3, 10),
    method: str = "alpha",
    permute: bool = False,
    normalize: bool = False,
    seed: int = 0,
    n_jobs: int | None = None,
) -> FlowResult:
    """Total H1 persistence of neuron-pair clouds for every layer pair at each gap, per sample.

    ``acts``: (n_samples, n_layers, width) array, or a mapping layer -> (n_samples, width)
    (ordered by depth). ``permute=True`` is the control (neuron indices of the later layer
    shuffled per sample). ``normalize=True`` z-scores each layer vector per sample, so that
    layers whose scale grows with depth stay comparable. Gaps beyond the depth are skipped. ``n_jobs`` threads
    (default: one per core) share the clouds; the result does not depend on it.
    """
    arr, layers = _stack(acts)
    n_samples, n_layers, _ = arr.shape
    if normalize:
        mu = arr.mean(axis=2, keepdims=True)
        sd = arr.std(axis=2, keepdims=True)
        arr = (arr - mu) / np.where(sd > 0, sd, 1.0)
    rng = np.random.default_rng(seed)
    gaps = tuple(int(g) for g in gaps)
    if any(g < 1 for g in gaps):
        raise WorkbenchError(f"layer gaps must be >= 1; got {gaps}")
    kept = tuple(g for g in gaps if g < n_layers)
    if len(kept) < len(gaps):
        log.info("skipping gaps %s: only %d layers", sorted(set(gaps) - set(kept)), n_layers)
    pairs, tasks = {}, []
    for g in kept:  # the permutations drawn in one fixed order, so threads change nothing
        pairs[g] = [(layers[k], layers[k + g]) for k in range(n_layers - g)]
        tasks += [(g, k, s, rng.permutation(arr.shape[2]) if permute else None)
                  for k in range(n_layers - g) for s in range(n_samples)]

    def one(task):
        g, k, s, order = task
        later = arr[s, k + g] if order is None else arr[s, k + g][order]
        return total_h1_persistence(neuron_cloud(arr[s, k], later), method)

    with ThreadPoolExecutor(max(1, n_jobs or os.cpu_count() or 1)) as pool:  # qhull releases the GIL: 1.85x on 2 cores
        values = list(pool.map(one, tasks, chunksize=64))
    totals = {g: np.zeros((n_layers - g, n_samples)) for g in kept}
    for (g, k, s, _), value in zip(tasks, values, strict=True):
        totals[g][k, s] = value
    return FlowResult(layers, kept, pairs, totals, method, permute)


@dataclass
class FlowContrast:
    """Condition A vs B per gap and layer pair: Hedges' g (b - a) of total H1 over samples,
    permutation p, BH q across all gaps x pairs; ``control_*`` the same with neuron indices
    shuffled, where a real flow difference should vanish."""

    gaps: tuple[int, ...]
    pairs: dict[int, list[tuple]]
    g: dict[int, np.ndarray]
    p: dict[int, np.ndarray]
    q: dict[int, np.ndarray]
    control_g: dict[int, np.ndarray]
    control_q: dict[int, np.ndarray]
    a: FlowResult
    b: FlowResult


def flow_contrast(
    acts_a, acts_b, gaps: Iterable[int] = (1, 3, 10), method: str = "alpha", n_perm: int = 2000, seed: int = 0
) -> FlowContrast:
    """Compare the neuron-flow curves of two conditions, with the shuffled-neuron control beside them."""
    from workbench.topology.stats import benjamini_hochberg, hedges_g, permutation_test

    runs = {
        (cond, shuffled): neuron_flow(acts, gaps, method, permute=shuffled, seed=seed + 2 * i + shuffled)
        for i, (cond, acts) in enumerate((("a", acts_a), ("b", acts_b)))
        for shuffled in (False, True)
    }
    a, b = runs["a", False], runs["b", False]
    if a.gaps != b.gaps or any(a.pairs[g] != b.pairs[g] for g in a.gaps):
        raise WorkbenchError("the two conditions must have the same layers")
    out: dict[str, dict] = {key: {} for key in ("g", "p", "cg", "cp")}
    for g in a.gaps:
        for key_g, key_p, shuffled in (("g", "p", False), ("cg", "cp", True)):
            ta, tb = runs["a", shuffled].totals[g].T, runs["b", shuffled].totals[g].T  # (samples, pairs)
            out[key_g][g] = hedges_g(ta, tb)
            out[key_p][g] = permutation_test(ta, tb, n_perm=n_perm, seed=seed)

    def bh(ps: dict) -> dict:
        if not ps:
            return {}
        flat = benjamini_hochberg(np.concatenate([ps[g] for g in a.gaps]))
        bounds = np.cumsum([0] + [len(ps[g]) for g in a.gaps])
        return {g: flat[bounds[i] : bounds[i + 1]] for i, g in enumerate(a.gaps)}

    return FlowContrast(a.gaps, a.pairs, out["g"], out["p"], bh(out["p"]), out["cg"], bh(out["cp"]), a, b)
