"""Checks on point clouds before any persistence is computed.

Every problem a user can cause becomes a one-line ``WorkbenchError`` that says what to do,
instead of a NaN diagram, a MemoryError or an index overflow deep inside ripser.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from workbench.errors import WorkbenchError

log = logging.getLogger(__name__)

# Largest cloud we run a full (no threshold, no landmarks) Rips complex on, per maxdim.
# Measured on 2 cores: H1 at 4096 points takes ~20-80 s and 1-2 GB, and grows as n^3;
# ripser fails with bad_alloc near 15k points in H1. H2 grows as n^4.
MAX_FULL_RIPS_POINTS = {1: 6000, 2: 800, 3: 150}


def as_points(points, name: str = "points") -> np.ndarray:
    """A finite, 2-D float array of at least 3 distinct points, or a WorkbenchError saying why not.

    Duplicate rows are allowed (they only add zero-length bars, which are dropped) and logged at INFO.
    """
    try:
        if hasattr(points, "detach"):  # torch tensor, without importing torch
            points = points.detach().cpu().numpy()
        X = np.asarray(points)
    except (TypeError, ValueError) as err:
        raise WorkbenchError(f"{name} could not be read as a numeric array: {err}") from err
    if X.dtype == object or not (np.issubdtype(X.dtype, np.number) or X.dtype == bool):
        raise WorkbenchError(f"{name} must be numeric; got dtype {X.dtype}")
    if X.dtype.kind == "c":  # a cast would drop the imaginary parts without a word
        raise WorkbenchError(f"{name} is complex ({X.dtype}); pass real coordinates, e.g. np.c_[z.real, z.imag]")
    if X.ndim != 2:
        hint = (
            " (a single point cloud is n_points x dim; reshape 1-D data with x[:, None])"
            if X.ndim == 1
            else ""
        )
        raise WorkbenchError(f"{name} must be a 2-D array (n_points, dim); got shape {X.shape}{hint}")
    n, d = X.shape
    if d == 0:
        raise WorkbenchError(
            f"{name} has zero-dimensional points (shape {X.shape}); there is nothing to measure"
        )
    if n < 3:
        raise WorkbenchError(f"{name} has {n} point(s); persistent homology needs at least 3")
    if X.dtype.kind in "iub":
        X = X.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(X).all(axis=1))
    if bad.size:
        shown = ", ".join(map(str, bad[:10])) + (f" and {bad.size - 10} more" if bad.size > 10 else "")
        raise WorkbenchError(
            f"{name} has NaN or inf values in {bad.size} row(s): {shown}; drop or impute them"
        )
    if np.ptp(X, axis=0).max() == 0:
        raise WorkbenchError(f"{name} is constant (all {n} points identical); its topology is a single point")
    n_unique = len(np.unique(X, axis=0)) if n <= 200_000 else n
    if n_unique < 3:
        raise WorkbenchError(
            f"{name} has only {n_unique} distinct points; persistent homology needs at least 3"
        )
    if n_unique < n:
        log.info(
            "%s: %d duplicate rows; they only add zero-length bars, which are dropped", name, n - n_unique
        )
    return X


def check_rips_size(n: int, maxdim: int, thresh: float, max_points: int | None = None) -> None:
    """Refuse a full Rips complex that would not fit, proposing landmarks or a threshold.

    With a threshold the complex may be small, but simplex indices (binomial coefficients
    in 64-bit integers inside ripser/giotto-ph) must still not overflow.
    """
    if maxdim < 1:
        return
    if math.comb(n, maxdim + 2) >= 2**62:
        raise WorkbenchError(
            f"{n} points overflow the simplex indices of ripser/giotto-ph for H{maxdim}: pass landmarks "
            f"(e.g. landmarks=2000, Hausdorff error bound reported) or lower maxdim"
        )
    if math.isfinite(thresh):
        return
    limit = max_points if max_points is not None else MAX_FULL_RIPS_POINTS.get(maxdim, 100)
    if n <= limit:
        return
    simplices = math.comb(n, maxdim + 2)
    raise WorkbenchError(
        f"{n} points is too many for a full Rips complex up to H{maxdim} (~{simplices:.1e} simplices, limit {limit} "
        f"points): pass landmarks={limit // 4} (a subsample; the Hausdorff error bound is reported) or a thresh "
        f"(e.g. a low quantile of the pairwise distances), or raise max_points if you have the memory"
    )
