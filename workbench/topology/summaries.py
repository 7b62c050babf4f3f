"""Persistence diagrams as feature vectors: scikit-learn transformers, plus diagram distances.

Every transformer takes a sequence of samples, each sample being the diagrams of one cloud:
a ``PersistenceResult``, a ``{"dgms": [...]}`` dict, or a list of ``(n_i, 2)`` arrays, one per
homology dimension. So ``make_pipeline(RipsPersistence(maxdim=1), BarcodeSummary(),
LogisticRegression())`` is a classifier over point clouds and cross-validation comes free.

Infinite bars (the essential H0 class, classes cut by ``thresh``) have no length; the
vectorisers drop them, so "count" means finite bars. Empty diagrams give zero features
(not NaN), so downstream estimators never see missing values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

from workbench.errors import WorkbenchError

STATS_OF = ("birth", "death", "persistence", "midpoint")


def diagrams_of(sample) -> list[np.ndarray]:
    """The per-dimension diagrams of one sample, whatever container it came in."""
    dgms = getattr(sample, "dgms", None)
    if dgms is None and isinstance(sample, dict):
        dgms = sample.get("dgms")
    if dgms is None:
        dgms = sample
    if isinstance(dgms, np.ndarray) and dgms.ndim == 2:
        raise WorkbenchError(
            "a sample must hold one diagram per dimension (a list of (n, 2) arrays), not one array"
        )
    out = []
    for d in dgms:
        a = np.asarray(d, dtype=np.float64)
        if a.size == 0:
            a = a.reshape(0, 2)
        if a.ndim != 2 or a.shape[1] != 2:
            raise WorkbenchError(f"a diagram must be an (n, 2) array of (birth, death); got shape {a.shape}")
        out.append(a)
    return out


def finite_bars(sample, dim: int) -> np.ndarray:
    """The finite bars of dimension ``dim`` (none if the sample stops below ``dim``)."""
    dgms = diagrams_of(sample)
    if dim >= len(dgms):
        return np.empty((0, 2))
    d = dgms[dim]
    return d[np.isfinite(d).all(axis=1)]


def persistent_entropy(lifetimes: np.ndarray) -> float:
    """E = -sum p_i ln p_i with p_i = l_i / sum(l): low when a few bars dominate."""
    life = lifetimes[lifetimes > 0]
    total = life.sum()
    if total <= 0:
        return 0.0
    p = life / total
    return float(-(p * np.log(p)).sum())


class RipsPersistence(TransformerMixin, BaseEstimator):
    """Point clouds -> ``PersistenceResult`` per cloud (stateless; see ``rips_persistence``)."""

    def __init__(
        self,
        maxdim=1,
        metric="euclidean",
        thresh=math.inf,
        landmarks=None,
        n_threads=None,
        backend="auto",
        landmark_method="random",
        full_h0=False,
    ):
        self.maxdim = maxdim
        self.metric = metric
        self.thresh = thresh
        self.landmarks = landmarks
        self.n_threads = n_threads
        self.backend = backend
        self.landmark_method = landmark_method
        self.full_h0 = full_h0

    def fit(self, X, y=None):
        return self

    def transform(self, X):
        from workbench.topology.persistence import rips_persistence

        return [
            rips_persistence(
                c,
                maxdim=self.maxdim,
                metric=self.metric,
                thresh=self.thresh,
                landmarks=self.landmarks,
                n_threads=self.n_threads,
                backend=self.backend,
                landmark_method=self.landmark_method,
                full_h0=self.full_h0,
            )
            for c in X
        ]


class BarcodeSummary(TransformerMixin, BaseEstimator):
    """The reference study's barcode vector, per homology dimension, with named features.

    Per dimension: finite bar count; mean, std and ``quantiles`` of birth, death,
    persistence and midpoint; total persistence; persistent entropy (31 features with the
    default five quantiles). Names look like ``h1_persistence_p90`` so reports can say
    which one moved.
    """

    def __init__(self, dims=(0, 1), quantiles=(10, 25, 50, 75, 90)):
        self.dims = dims
        self.quantiles = quantiles

    def _names(self) -> list[str]:
        names = []
        for dim in self.dims:
            names.append(f"h{dim}_count")
            for what in STATS_OF:
                names += [f"h{dim}_{what}_mean", f"h{dim}_{what}_std"]
                names += [f"h{dim}_{what}_p{q:g}" for q in self.quantiles]
            names += [f"h{dim}_total_persistence", f"h{dim}_entropy"]
        return names

    def fit(self, X, y=None):
        if not all(0 <= q <= 100 for q in self.quantiles):
            raise WorkbenchError(f"quantiles are percentages in [0, 100]; got {self.quantiles}")
        for sample in X:
            diagrams_of(sample)
        self.feature_names_ = self._names()
        self.n_features_out_ = len(self.feature_names_)
        return self

    def transform(self, X) -> np.ndarray:
        out = np.zeros((len(X), self.n_features_out_))
        for row, sample in enumerate(X):
            out[row] = np.concatenate([self._dim_features(finite_bars(sample, dim)) for dim in self.dims])
        return out

    def _dim_features(self, bars: np.ndarray) -> np.ndarray:
        per_stat = 2 + len(self.quantiles)
        feats = np.zeros(1 + per_stat * len(STATS_OF) + 2)
        if len(bars) == 0:
            return feats
        birth, death = bars[:, 0], bars[:, 1]
        life = death - birth
        values = np.stack([birth, death, life, (birth + death) / 2])
        stats = np.concatenate(
            [
                values.mean(1, keepdims=True),
                values.std(1, keepdims=True),
                np.percentile(values, self.quantiles, axis=1).T,
            ],
            axis=1,
        )
        feats[0] = len(bars)
        feats[1 : 1 + stats.size] = stats.ravel()
        feats[-2] = life.sum()
        feats[-1] = persistent_entropy(life)
        return feats

    def get_feature_names_out(self, input_features=None):
        return np.asarray(self.feature_names_, dtype=object)


class _OneDimension(TransformerMixin, BaseEstimator):
    """Shared fit/transform for gudhi.representations vectorisers of one homology dimension.

    Ranges left as None are fitted from the finite bars seen in ``fit`` (and stored), so
    train and test samples are vectorised on the same grid.
    """

    prefix = ""

    def _bars(self, X) -> list[np.ndarray]:
        return [finite_bars(sample, self.dim) for sample in X]

    def _extent(self, bars: list[np.ndarray]) -> tuple[float, float, float]:
        """min birth, max death, max persistence over all bars (a unit box when there are none)."""
        stacked = np.concatenate(bars) if bars else np.empty((0, 2))
        if len(stacked) == 0:
            return 0.0, 1.0, 1.0
        lo, hi = float(stacked[:, 0].min()), float(stacked[:, 1].max())
        top = float((stacked[:, 1] - stacked[:, 0]).max())
        return lo, (hi if hi > lo else lo + 1.0), (top if top > 0 else 1.0)

    def fit(self, X, y=None):
        bars = self._bars(X)
        self.vectorizer_ = self._make(bars).fit(bars)
        self.n_features_out_ = int(self.vectorizer_.transform([np.empty((0, 2))]).shape[1])
        return self

    def transform(self, X) -> np.ndarray:
        return np.asarray(self.vectorizer_.transform(self._bars(X)), dtype=np.float64)

    def get_feature_names_out(self, input_features=None):
        return np.asarray(
            [f"{self.prefix}_h{self.dim}_{i}" for i in range(self.n_features_out_)], dtype=object
        )


class BettiCurve(_OneDimension):
    """Number of bars of dimension ``dim`` alive at each of ``resolution`` scales."""

    prefix = "betti"

    def __init__(self, dim=1, resolution=100, sample_range=None):
        self.dim = dim
        self.resolution = resolution
        self.sample_range = sample_range

    def _make(self, bars):
        from gudhi.representations import BettiCurve as GudhiBetti

        lo, hi, _ = self._extent(bars)
        self.sample_range_ = tuple(self.sample_range) if self.sample_range is not None else (lo, hi)
        return GudhiBetti(resolution=self.resolution, sample_range=list(self.sample_range_))


class PersistenceLandscape(_OneDimension):
    """The first ``num_landscapes`` landscape functions of dimension ``dim``, sampled on a grid."""

    prefix = "landscape"

    def __init__(self, dim=1, num_landscapes=5, resolution=100, sample_range=None):
        self.dim = dim
        self.num_landscapes = num_landscapes
        self.resolution = resolution
        self.sample_range = sample_range

    def _make(self, bars):
        from gudhi.representations import Landscape

        lo, hi, _ = self._extent(bars)
        self.sample_range_ = tuple(self.sample_range) if self.sample_range is not None else (lo, hi)
        return Landscape(
            num_landscapes=self.num_landscapes,
            resolution=self.resolution,
            sample_range=list(self.sample_range_),
        )


class PersistenceImage(_OneDimension):
    """Gaussian-smoothed (birth, persistence) density of dimension ``dim`` on a grid.

    ``bandwidth=None`` uses a tenth of the largest persistence seen in ``fit``.
    """

    prefix = "image"

    def __init__(self, dim=1, resolution=(20, 20), bandwidth=None, im_range=None):
        self.dim = dim
        self.resolution = resolution
        self.bandwidth = bandwidth
        self.im_range = im_range

    def _make(self, bars):
        from gudhi.representations import PersistenceImage as GudhiImage

        lo, hi, top = self._extent(bars)
        births = np.concatenate([b[:, 0] for b in bars]) if bars else np.empty(0)
        b_hi = float(births.max()) if births.size and births.max() > lo else lo + 1.0
        self.im_range_ = tuple(self.im_range) if self.im_range is not None else (lo, b_hi, 0.0, top)
        self.bandwidth_ = self.bandwidth if self.bandwidth is not None else top / 10
        return GudhiImage(
            bandwidth=self.bandwidth_, resolution=list(self.resolution), im_range=list(self.im_range_)
        )


def bottleneck_distance(dgm_a, dgm_b) -> float:
    """Bottleneck distance of two diagrams of one dimension (inf if their infinite bars differ in number)."""
    import gudhi

    return float(gudhi.bottleneck_distance(_one(dgm_a), _one(dgm_b)))


def wasserstein_distance(dgm_a, dgm_b, order: float = 1.0) -> float:
    """q-Wasserstein distance (L-infinity ground metric) of two diagrams of one dimension (gudhi/Hera)."""
    from gudhi.hera import wasserstein_distance as hera_wasserstein

    return float(hera_wasserstein(_one(dgm_a), _one(dgm_b), order=order, internal_p=np.inf))


def _one(dgm) -> np.ndarray:
    a = np.asarray(dgm, dtype=np.float64)
    if a.size == 0:
        return np.empty((0, 2))
    if a.ndim != 2 or a.shape[1] != 2:
        raise WorkbenchError(f"a diagram must be an (n, 2) array of (birth, death); got shape {a.shape}")
    return a


def pairwise_diagram_distances(samples: Sequence, dim: int, metric: str = "wasserstein", order: float = 1.0):
    """Symmetric matrix of bottleneck or Wasserstein distances between samples' dimension-``dim`` diagrams."""
    if metric not in ("wasserstein", "bottleneck"):
        raise WorkbenchError(f"unknown diagram metric {metric!r}; use 'wasserstein' or 'bottleneck'")
    dgms = [diagrams_of(s)[dim] if dim < len(diagrams_of(s)) else np.empty((0, 2)) for s in samples]
    n = len(dgms)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            if metric == "bottleneck":
                out[i, j] = bottleneck_distance(dgms[i], dgms[j])
            else:
                out[i, j] = wasserstein_distance(dgms[i], dgms[j], order)
            out[j, i] = out[i, j]
    return out
