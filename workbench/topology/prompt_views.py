"""Topological views of one prompt, as scikit-learn transformers: what a per-prompt detector can read from PH.

* ``TokenCloudBarcode``: the Rips barcode of the prompt's own token cloud (e.g. the document span at one
  layer), summarised so that it does not grow with the number of tokens: each cloud is scaled by its median
  pairwise distance, ``n_subsamples`` random subsets of exactly ``n_points`` tokens are taken, and the
  per-dimension ``BarcodeSummary`` of their barcodes is averaged. Counts, totals and quantiles then describe
  a cloud of fixed size, so a long document cannot win by being long; the median distance itself (the
  cloud's scale) is kept as one more column.
* ``ReferenceCloudDelta``: how one point (the prompt's last-token activation) changes the barcode of a fixed
  cloud of clean points: summary(reference + point) minus summary(reference), plus the point's
  nearest-neighbour distance. ``fit(X, y)`` draws the reference from the clean rows (``y == 0``), so the
  transformer sits first in a ``Pipeline`` and cross-validation never leaks a scored row into its reference.

Both are deterministic for a given ``seed``.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

from workbench.errors import WorkbenchError


def _summary(maxdim: int):
    from workbench.topology.summaries import BarcodeSummary

    return BarcodeSummary(dims=tuple(range(maxdim + 1))).fit([])


def _check_maxdim(maxdim) -> None:
    if maxdim not in (0, 1, 2):
        raise WorkbenchError(f"maxdim must be 0, 1 or 2, got {maxdim!r}")


class TokenCloudBarcode(TransformerMixin, BaseEstimator):
    """Token clouds (a sequence of ``(n_i, d)`` arrays) -> fixed-size barcode features that do not grow with n_i.

    A cloud with fewer than ``n_points`` tokens is used whole (once); one with fewer than 3 gives zeros.
    """

    def __init__(self, n_points=32, n_subsamples=4, maxdim=1, seed=0):
        self.n_points = n_points
        self.n_subsamples = n_subsamples
        self.maxdim = maxdim
        self.seed = seed

    def _validate(self) -> None:
        _check_maxdim(self.maxdim)
        for name, low in (("n_points", 4), ("n_subsamples", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise WorkbenchError(f"{name} must be an integer >= {low}, got {value!r}")

    def fit(self, X=None, y=None):
        self._validate()
        self.feature_names_ = [*_summary(self.maxdim).get_feature_names_out(), "median_distance"]
        self.n_features_out_ = len(self.feature_names_)
        return self

    def transform(self, X) -> np.ndarray:
        if not hasattr(self, "n_features_out_"):
            self.fit()
        return np.stack([self._one(np.asarray(c, dtype=np.float64)) for c in X]) if len(X) else np.zeros(
            (0, self.n_features_out_))

    def _one(self, cloud: np.ndarray) -> np.ndarray:
        from scipy.spatial.distance import pdist

        from workbench.topology.persistence import rips_persistence

        out = np.zeros(self.n_features_out_)
        if cloud.ndim != 2 or len(cloud) < 3:
            return out
        if not np.isfinite(cloud).all():
            raise WorkbenchError("a token cloud holds NaN or inf: the model's activations overflowed "
                                 "(use float32 or check the weights)")
        # the seed and the cloud's own size fix the subsets: a prompt's features never depend on its batch
        rng = np.random.default_rng([self.seed, len(cloud)])
        scale = float(np.median(pdist(cloud[rng.choice(len(cloud), min(len(cloud), 256), replace=False)])))
        if scale <= 0:
            return out
        summary = _summary(self.maxdim)
        draws = 1 if len(cloud) <= self.n_points else self.n_subsamples
        feats = []
        for _ in range(draws):
            rows = rng.choice(len(cloud), min(len(cloud), self.n_points), replace=False)
            feats.append(summary.transform([rips_persistence(cloud[rows] / scale, maxdim=self.maxdim, backend="ripser")])[0])
        out[:-1] = np.mean(feats, axis=0)
        out[-1] = scale
        return out

    def get_feature_names_out(self, input_features=None):
        if not hasattr(self, "feature_names_"):
            self.fit()
        return np.asarray(self.feature_names_, dtype=object)


class ReferenceCloudDelta(TransformerMixin, BaseEstimator):
    """Points -> how each changes the barcode of a reference cloud of clean points (fitted on ``y == 0`` rows)."""

    def __init__(self, size=64, maxdim=1, seed=0):
        self.size = size
        self.maxdim = maxdim
        self.seed = seed

    def fit(self, X, y=None):
        from workbench.topology.persistence import rips_persistence

        _check_maxdim(self.maxdim)
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 3:
            raise WorkbenchError(f"size must be an integer >= 3, got {self.size!r}")
        X = np.asarray(X, dtype=np.float64)
        clean = np.flatnonzero(np.asarray(y) == 0) if y is not None else np.arange(len(X))
        if len(clean) < 3:
            raise WorkbenchError(f"the reference cloud needs at least 3 clean rows, got {len(clean)}")
        rng = np.random.default_rng(self.seed)
        self.reference_ = X[rng.choice(clean, min(self.size, len(clean)), replace=False)]
        self.base_ = _summary(self.maxdim).transform([rips_persistence(self.reference_, maxdim=self.maxdim)])[0]
        self.n_features_in_ = X.shape[1]
        return self

    def transform(self, X) -> np.ndarray:
        from workbench.topology.persistence import rips_persistence

        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise WorkbenchError(f"ReferenceCloudDelta was fitted on {self.n_features_in_} columns, got {X.shape}")
        summary = _summary(self.maxdim)
        with_point = summary.transform([rips_persistence(np.vstack([self.reference_, p[None]]), maxdim=self.maxdim, backend="ripser")
                                        for p in X])
        nn = np.sqrt(((X[:, None, :] - self.reference_[None]) ** 2).sum(-1)).min(1)
        return np.c_[with_point - self.base_, nn]

    def get_feature_names_out(self, input_features=None):
        names = [f"delta_{n}" for n in _summary(self.maxdim).get_feature_names_out()]
        return np.asarray([*names, "nn_distance"], dtype=object)
