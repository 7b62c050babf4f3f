"""Late fusion of detectors that read different things: the mean of their standardized logits.

The injected-token probe and the pooled document features fail on different sources (in
studies/injection_detection the token probe held the generator at 0.78 where the span features fell to 0.62,
and the span features held AgentDojo's banking suite at 0.96 where the token probe fell to 0.87). One logistic
regression over both sets of columns lets the thousand pooled columns drown the probe's three scores; fitting
each detector on its own columns and averaging their logits, each centred and scaled by its own training
rows' logits, gives both the same say whatever their scale.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, clone

from workbench.detect.shared_fits import fit


class LogitMean(ClassifierMixin, BaseEstimator):
    """``members``: unfitted pipelines (each ending in a classifier); ``columns``: the ``[start, stop)`` of X each
    reads; ``weights``: each member's say (None: equal). ``predict_proba`` is the sigmoid of the weighted mean of
    the members' standardized decision values."""

    def __init__(self, members=(), columns=(), weights=None):
        self.members = members
        self.columns = columns
        self.weights = weights

    def _parts(self, X) -> list[np.ndarray]:
        X = np.asarray(X, dtype=np.float64)
        return [X[:, a:b] for a, b in self.columns]

    def fit(self, X, y):
        if len(self.members) != len(self.columns) or not self.members:
            raise ValueError("LogitMean needs one [start, stop) column range per member")
        _combine(self.weights, np.zeros((len(self.columns), 0)))  # bad weights fail before any member is fitted
        parts = self._parts(X)
        self.members_ = [fit(clone(m), part, y) for m, part in zip(self.members, parts, strict=True)]
        raw = [m.decision_function(part) for m, part in zip(self.members_, parts, strict=True)]
        self.center_ = np.array([r.mean() for r in raw])
        self.scale_ = np.array([r.std() + 1e-9 for r in raw])
        self.classes_ = np.unique(y)
        self.n_features_in_ = np.asarray(X).shape[1]
        return self

    def standardized(self, X) -> np.ndarray:
        """[members, rows]: each member's decision values, centred and scaled by its own training rows'."""
        raw = [m.decision_function(part) for m, part in zip(self.members_, self._parts(X), strict=True)]
        return np.array([(r - c) / s for r, c, s in zip(raw, self.center_, self.scale_, strict=True)])

    def decision_function(self, X) -> np.ndarray:
        return _combine(self.weights, self.standardized(X))

    def reweighed_proba(self, X, options) -> dict:
        """P(injected) of ``X`` under each weighting in ``options``, from one pass over the fitted members: the
        members' fits and scaling do not depend on the weights, so each is the ``predict_proba`` of a fusion fitted
        with those weights."""
        z = self.standardized(X)
        return {w: _sigmoid(_combine(w, z)) for w in options}

    def predict_proba(self, X) -> np.ndarray:
        p = _sigmoid(self.decision_function(X))
        return np.c_[1.0 - p, p]

    def predict(self, X) -> np.ndarray:
        return self.classes_[(self.decision_function(X) > 0).astype(int)]


def _combine(weights, z: np.ndarray) -> np.ndarray:
    """The weighted mean of the members' standardized logits ``z`` ([members, rows]; ``weights`` None: the plain
    mean), refusing weights that are not one non-negative number per member, not all 0."""
    if weights is None:
        return z.mean(axis=0)
    w = np.asarray(weights, dtype=float)
    if w.shape != (len(z),) or (w < 0).any() or not w.sum() > 0:
        raise ValueError(f"LogitMean weights {weights!r}: one non-negative weight per member, not all 0")
    return (w / w.sum()) @ z


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))
