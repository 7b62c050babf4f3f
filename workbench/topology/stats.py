"""Statistics across conditions, per layer: is the topology of condition A different from B?

The protocol of the reference study: K subsamples of k points per condition and layer, a
barcode summary vector per subsample; then per feature an effect size with a bootstrap CI,
Welch and permutation tests with Benjamini–Hochberg FDR across layers x features, and a
cross-validated logistic-regression AUC on the summary vectors. A linear probe on the raw
activations of the same rows is computed beside it, so the value of topology is measured.

Leakage: subsamples of one pool share rows, so cross-validating over them would test on
rows seen in training. Here the rows of each condition are first split into ``n_splits``
disjoint parts and every subsample is drawn inside one part; folds are parts. The tests
still treat the K subsamples as independent (as the reference did): with k close to n/parts
they overlap and p-values are optimistic — read them with the effect sizes.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

from workbench.errors import WorkbenchError

log = logging.getLogger(__name__)

# Subsample sizes whose Rips barcode costs about a second on 2 cores in ~576 dims
# (bench_h1 --quick: giotto-ph H1 of 1024 activation-like points, 1.25 s; H2 grows as n^4).
DEFAULT_K = {0: 4096, 1: 1000, 2: 200}
SHARED_DISTANCES_MAX = 6000  # rows whose distance matrix (144 MB in float32) the subsamples share


@dataclass
class Subsamples:
    """Summary vectors of K subsamples of one cloud; ``part[i]`` is the row part subsample i came from."""

    features: np.ndarray  # (K, n_features)
    names: list[str]
    part: np.ndarray  # (K,)
    rows: list[np.ndarray]  # row indices of each subsample
    hausdorff: np.ndarray  # (K,) landmark error per subsample (0 without landmarks)


def _parts(n: int, n_parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    return np.array_split(rng.permutation(n), n_parts)


def subsample_summaries(
    cloud,
    k: int,
    K: int = 64,
    n_parts: int = 5,
    maxdim: int = 1,
    metric: str = "euclidean",
    landmarks: int | None = None,
    n_threads: int | None = None,
    seed: int = 0,
    summary=None,
    full_h0: bool = False,
) -> Subsamples:
    """K barcode summaries of k-point subsamples, drawn inside ``n_parts`` disjoint row parts.

    ``summary`` is a transformer over diagrams (default ``BarcodeSummary`` over dimensions
    0..maxdim). ``DEFAULT_K[maxdim]`` makes one barcode cost about a second on 2 cores;
    ``landmarks`` trades accuracy (bound reported) for speed beyond that, and with ``full_h0`` H0 stays exact
    (the whole subsample's minimum spanning tree; the bound then concerns H1 and up): the reference scale,
    k = 4096 and K = 64 per class, runs in about a minute per layer on 2 cores (``bench/bench_reference_topology.py``).
    """
    from workbench.topology.persistence import dense_distances, rips_persistence
    from workbench.topology.summaries import BarcodeSummary
    from workbench.topology.validate import as_points

    X = as_points(cloud)
    n = len(X)
    if n_parts < 1 or n_parts > K:
        raise WorkbenchError(f"need K >= n_parts >= 1 (got K={K}, n_parts={n_parts})")
    size = n // n_parts
    if not 3 <= k <= size:
        raise WorkbenchError(
            f"k={k} points per subsample but each of {n_parts} disjoint parts of {n} rows has {size}; "
            f"use k <= {size} or fewer parts"
        )
    rng = np.random.default_rng(seed)
    parts = _parts(n, n_parts, rng)
    summary = summary if summary is not None else BarcodeSummary(dims=tuple(range(maxdim + 1)))
    # K subsamples of one cloud share its rows: one distance matrix of the cloud, read K times, instead of K
    # matrices and K validations (equal up to float rounding; a third of the probe's per-layer time)
    D = dense_distances(X, metric) if landmarks is None and n <= SHARED_DISTANCES_MAX else None
    results, part_of, rows = [], [], []
    for i in range(K):
        p = i % n_parts
        idx = rng.choice(parts[p], size=k, replace=False)
        results.append(
            rips_persistence(X[idx], maxdim=maxdim, metric=metric, landmarks=landmarks, n_threads=n_threads,
                             full_h0=full_h0)
            if D is None else
            rips_persistence(D[np.ix_(idx, idx)], maxdim=maxdim, metric=metric, n_threads=n_threads,
                             distance_matrix=True)
        )
        part_of.append(p)
        rows.append(idx)
    summary.fit(results)
    return Subsamples(
        features=summary.transform(results),
        names=list(summary.get_feature_names_out()),
        part=np.asarray(part_of),
        rows=rows,
        hausdorff=np.array([r.hausdorff for r in results]),
    )


def hedges_g(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Standardised mean difference (b - a) per column, small-sample corrected; 0 where both are constant."""
    a, b = np.atleast_2d(a.T).T, np.atleast_2d(b.T).T
    na, nb = len(a), len(b)
    pooled = np.sqrt(((na - 1) * a.var(0, ddof=1) + (nb - 1) * b.var(0, ddof=1)) / (na + nb - 2))
    diff = b.mean(0) - a.mean(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(pooled > 0, diff / pooled, 0.0)
    return d * (1 - 3 / (4 * (na + nb) - 9))


def bootstrap_ci(a, b, stat=hedges_g, n_boot: int = 1000, level: float = 0.95, seed: int = 0):
    """Percentile bootstrap CI of ``stat(a, b)`` per column (rows resampled within each group)."""
    rng = np.random.default_rng(seed)
    draws = np.stack(
        [stat(a[rng.integers(0, len(a), len(a))], b[rng.integers(0, len(b), len(b))]) for _ in range(n_boot)]
    )
    tail = (1 - level) / 2 * 100
    return np.percentile(draws, tail, axis=0), np.percentile(draws, 100 - tail, axis=0)


def welch_test(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Welch t statistic and two-sided p per column; p = 1 where both groups are constant and equal."""
    from scipy.stats import ttest_ind

    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # constant columns are handled below
        t, p = ttest_ind(b, a, axis=0, equal_var=False)
    t, p = np.atleast_1d(t).astype(float), np.atleast_1d(p).astype(float)
    same = np.isnan(p) & np.isclose(a.mean(0), b.mean(0))
    p[same], t[same] = 1.0, 0.0
    p[np.isnan(p)] = 0.0  # constant groups with different values: separated perfectly
    return t, p


def part_means(features: np.ndarray, part: np.ndarray) -> np.ndarray:
    """Mean feature vector of each row part: the independent units of the subsample protocol."""
    return np.stack([features[part == p].mean(0) for p in np.unique(part)])


def permutation_test(a: np.ndarray, b: np.ndarray, n_perm: int = 2000, seed: int = 0) -> np.ndarray:
    """Two-sided permutation p of the mean difference per column, (hits + 1) / (n_perm + 1)."""
    rng = np.random.default_rng(seed)
    pooled = np.concatenate([a, b])
    na = len(a)
    observed = np.abs(b.mean(0) - a.mean(0))
    hits = np.zeros(pooled.shape[1])
    for _ in range(n_perm):
        perm = rng.permutation(len(pooled))
        diff = np.abs(pooled[perm[na:]].mean(0) - pooled[perm[:na]].mean(0))
        hits += diff >= observed - 1e-12 * np.maximum(1.0, observed)
    return (hits + 1) / (n_perm + 1)


def benjamini_hochberg(p) -> np.ndarray:
    """BH-adjusted q-values of any-shaped array of p-values (adjusted jointly, ``scipy.stats.false_discovery_control``).

    A NaN p-value (an untestable feature, e.g. constant in both classes) stays NaN and does not count among
    the tests; it never turns the other q-values into NaN, and a NaN q is never significant.
    """
    from scipy.stats import false_discovery_control

    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = false_discovery_control(np.clip(p[ok], 0.0, 1.0), method="bh")
    return out


class DropCorrelated(TransformerMixin, BaseEstimator):
    """Keep a feature only if its |correlation| with every kept earlier one is <= threshold (fitted on train).

    The reference study's step before logistic regression; constant features are dropped too.
    """

    def __init__(self, threshold=0.5):
        self.threshold = threshold

    def fit(self, X, y=None):
        X = np.asarray(X, dtype=float)
        varying = X.std(0) > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            C = np.abs(np.corrcoef(X, rowvar=False)) if X.shape[1] > 1 else np.zeros((1, 1))
        keep: list[int] = []
        for j in np.flatnonzero(varying):
            if all(not C[j, i] > self.threshold for i in keep):
                keep.append(j)
        self.keep_ = np.asarray(keep if keep else [0], dtype=int)
        return self

    def transform(self, X):
        return np.asarray(X, dtype=float)[:, self.keep_]


def cv_auc(X, y, groups=None, n_splits: int = 5, drop_correlated: float | None = 0.5, seed: int = 0) -> dict:
    """Cross-validated ROC AUC of a standardised logistic regression (folds = ``groups`` when given)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GroupKFold, StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = np.asarray(X, dtype=float), np.asarray(y)
    if len(np.unique(y)) != 2:
        raise WorkbenchError("AUC needs exactly two conditions in y")
    steps = [StandardScaler()]
    if drop_correlated is not None:
        steps.insert(0, DropCorrelated(drop_correlated))
    # newton-cg: the same L2 objective as the default lbfgs, converged in ~7 Newton steps instead of ~33 quasi-Newton
    # ones; 5x faster on the probe's 800 x 576 rows (the largest part of its per-layer time) and closer to the optimum
    pipe = make_pipeline(*steps, LogisticRegression(solver="newton-cg", max_iter=5000))
    if groups is not None:
        cv, kw = GroupKFold(n_splits=min(n_splits, len(np.unique(groups)))), {"groups": groups}
    else:
        cv, kw = StratifiedKFold(n_splits=n_splits, shuffle=True, random_state=seed), {}
    scores = cross_val_score(pipe, X, y, cv=cv, scoring="roc_auc", **kw)
    return {"auc": float(scores.mean()), "auc_std": float(scores.std()), "folds": scores}


@dataclass
class LayerComparison:
    """Per layer and feature: means, Hedges' g (b - a) with CI, Welch and permutation p, BH q
    (across all layers x features), and per layer the AUCs of topology and of the probes.

    ``p_welch``/``p_perm`` treat the K subsamples as independent, as the reference study did; they
    are optimistic because subsamples of one part share rows. ``p_parts`` is the honest test: a
    Welch test on the per-part means (parts are disjoint row sets, so those means are independent).
    """

    layers: list
    names: list[str]
    mean_a: np.ndarray  # (n_layers, n_features)
    mean_b: np.ndarray
    g: np.ndarray
    g_low: np.ndarray
    g_high: np.ndarray
    p_welch: np.ndarray
    p_perm: np.ndarray
    q_welch: np.ndarray
    q_perm: np.ndarray
    p_parts: np.ndarray
    q_parts: np.ndarray
    auc_topology: np.ndarray  # (n_layers,)
    auc_probe_rows: np.ndarray
    auc_probe_means: np.ndarray
    extras: dict = field(default_factory=dict)

    def top(self, n: int = 10) -> list[dict]:
        """The n (layer, feature) cells with the smallest permutation q (ties: larger |g|), as report rows."""
        order = np.lexsort((-np.abs(self.g).ravel(), self.q_perm.ravel()))[:n]
        out = []
        for flat in order:
            li, fi = np.unravel_index(flat, self.q_perm.shape)
            out.append(
                {
                    "layer": self.layers[li], "feature": self.names[fi], "g": float(self.g[li, fi]),
                    "g_ci": (float(self.g_low[li, fi]), float(self.g_high[li, fi])),
                    "q_perm": float(self.q_perm[li, fi]), "q_welch": float(self.q_welch[li, fi]),
                }
            )  # fmt: skip
        return out


def compare_conditions(
    clouds: dict,
    k: int | None = None,
    K: int = 64,
    n_parts: int = 5,
    maxdim: int = 1,
    metric: str = "euclidean",
    landmarks: int | None = None,
    n_boot: int = 1000,
    n_perm: int = 2000,
    n_threads: int | None = None,
    seed: int = 0,
) -> LayerComparison:
    """The whole protocol for ``clouds = {layer: (cloud_a, cloud_b)}`` (rows = prompts).

    Topology AUC: summaries of subsamples, folds = row parts (no row in train and test).
    Probe baselines on the same parts: per row (``auc_probe_rows``) and on the mean
    activation of each subsample (``auc_probe_means``, the set-level counterpart of the
    topology classifier). ``k=None``: ``DEFAULT_K[maxdim]``, capped by the part size.
    """
    layers = list(clouds)
    stats: dict[str, list] = {
        key: [] for key in ("ma", "mb", "g", "lo", "hi", "pw", "pp", "pparts", "auc", "rows", "means")
    }
    names: list[str] = []
    for li, layer in enumerate(layers):
        A, B = (np.asarray(c, dtype=np.float32) for c in clouds[layer])
        kl = k if k is not None else min(DEFAULT_K.get(maxdim, 200), min(len(A), len(B)) // n_parts)
        sa = subsample_summaries(A, kl, K, n_parts, maxdim, metric, landmarks, n_threads, seed + 2 * li)
        sb = subsample_summaries(B, kl, K, n_parts, maxdim, metric, landmarks, n_threads, seed + 2 * li + 1)
        names = sa.names
        a, b = sa.features, sb.features
        stats["ma"].append(a.mean(0))
        stats["mb"].append(b.mean(0))
        stats["g"].append(hedges_g(a, b))
        lo, hi = bootstrap_ci(a, b, n_boot=n_boot, seed=seed)
        stats["lo"].append(lo)
        stats["hi"].append(hi)
        stats["pw"].append(welch_test(a, b)[1])
        stats["pp"].append(permutation_test(a, b, n_perm=n_perm, seed=seed))
        stats["pparts"].append(welch_test(part_means(a, sa.part), part_means(b, sb.part))[1])
        y = np.r_[np.zeros(len(a)), np.ones(len(b))]
        groups = np.r_[sa.part, sb.part]
        stats["auc"].append(cv_auc(np.vstack([a, b]), y, groups, n_parts)["auc"])
        # probes on the rows that were drawn, folds = the same parts
        ra = np.unique(np.concatenate(sa.rows))
        rb = np.unique(np.concatenate(sb.rows))
        part_a, part_b = _row_parts(sa, len(A)), _row_parts(sb, len(B))
        Xr = np.vstack([A[ra], B[rb]])
        yr = np.r_[np.zeros(len(ra)), np.ones(len(rb))]
        stats["rows"].append(
            cv_auc(Xr, yr, np.r_[part_a[ra], part_b[rb]], n_parts, drop_correlated=None)["auc"]
        )
        Xm = np.vstack([np.stack([A[r].mean(0) for r in sa.rows]), np.stack([B[r].mean(0) for r in sb.rows])])
        stats["means"].append(cv_auc(Xm, y, groups, n_parts, drop_correlated=None)["auc"])
        log.info("layer %s: topology AUC %.3f, probe %.3f", layer, stats["auc"][-1], stats["rows"][-1])
    arr = {key: np.asarray(v) for key, v in stats.items()}
    return LayerComparison(
        layers, names, arr["ma"], arr["mb"], arr["g"], arr["lo"], arr["hi"], arr["pw"], arr["pp"],
        benjamini_hochberg(arr["pw"]), benjamini_hochberg(arr["pp"]), arr["pparts"], benjamini_hochberg(arr["pparts"]),
        arr["auc"], arr["rows"], arr["means"],
    )  # fmt: skip


def _row_parts(s: Subsamples, n: int) -> np.ndarray:
    """Part index of every row that appears in some subsample (-1 for rows never drawn)."""
    part = np.full(n, -1)
    for idx, p in zip(s.rows, s.part, strict=True):
        part[idx] = p
    return part
