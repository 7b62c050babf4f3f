"""A probe trained on the injected tokens themselves, scored as the most injection-like tokens of a document.

Pooled views (the document's mean and max, the last token) see an injection diluted in its document and learn
the house style of the sources they are fitted on. Every source records where its insertion lies
(``inserted_span``), so the probe can be told which tokens are injected: a mass-mean direction (the mean of
the injected tokens minus the mean of every other document token, on standardized activations; the difference
of class means generalizes better out of distribution than a fitted logistic direction on probing tasks) is
fitted on the tokens of the training rows, and a prompt's features are the top of its tokens' scores along
it: the maximum, the mean of the ``top`` highest, and the mean. Benign insertions of clean twins are negatives,
so imperatives that belong to the document are what the direction learns to tell apart.

Input rows are the ``doc_tokens`` view (``features.activation_features(tokens=...)``): ``tokens`` document tokens per prompt,
each its activation (``width`` numbers) followed by two flags, valid and role (0 document, 1 inserted, 2 outside
the document the source knows). The role is read only in ``fit`` (inserted only where the row is labelled
injected); ``transform`` reads activations and validity, so a user's prompt (no roles) is scored as a training
prompt is.

When the detector reads the whole user turn, the request (role 2) is read too, and a request and an injection
are both instructions to the assistant. The direction is then fitted on the document's tokens alone, as when
the document's bounds were known, and a request tagger (a logistic regression on the same standardized
activations, request tokens against document tokens, the injected ones among them) learns which tokens are the
user's request; ``transform`` leaves the tokens it tags out of the pooling, so the features need no blank-line
heuristic to find the document.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

from workbench.errors import WorkbenchError


class TokenProbe(TransformerMixin, BaseEstimator):
    """``fit(X, y)`` learns the injected-token direction; ``transform(X)`` gives [max, top-k mean, mean] scores."""

    def __init__(self, tokens: int = 64, top: int = 4):
        self.tokens = tokens
        self.top = top

    def _split(self, X) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] % self.tokens or X.shape[1] // self.tokens < 3:
            raise WorkbenchError(f"token probe input of shape {X.shape} is not {self.tokens} tokens of "
                                 "(activation, valid, role) per row: compute the doc_tokens view")
        T = X.reshape(len(X), self.tokens, -1)
        return T[..., :-2], T[..., -2] > 0.5, T[..., -1]

    def fit(self, X, y):
        acts, valid, role = self._split(X)
        y = np.asarray(y).astype(bool)
        outside = valid & (role > 1.5)  # the request and delimiters around a known document
        positive = valid & (role > 0.5) & (role < 1.5) & y[:, None]
        document = valid & ~outside
        negative = document & ~positive
        if not positive.any() or not negative.any():
            raise WorkbenchError("the token probe needs injected rows whose inserted tokens it can see "
                                 "(an 'inserted_span' on the training records) and document tokens besides")
        # the class means and the spread of every valid token, in chunks of rows: standardized copies of ~10^5
        # tokens x width made this fit a tenth of a detector's training time. The standardized mean difference
        # ((pos - mean) / scale).mean(0) - ((neg - mean) / scale).mean(0) is (pos.mean(0) - neg.mean(0)) / scale.
        total, pos_sum = np.zeros(acts.shape[-1]), np.zeros(acts.shape[-1])
        for rows in _chunks(len(acts)):
            total += acts[rows][document[rows]].sum(0)
            pos_sum += acts[rows][positive[rows]].sum(0)
        n, n_pos = int(document.sum()), int(positive.sum())
        self.mean_ = total / n
        squares = np.zeros(acts.shape[-1])
        for rows in _chunks(len(acts)):
            squares += ((acts[rows][document[rows]] - self.mean_) ** 2).sum(0)
        self.scale_ = np.sqrt(squares / n) + 1e-6
        direction = (pos_sum / n_pos - (total - pos_sum) / (n - n_pos)) / self.scale_
        self.direction_ = direction / (np.linalg.norm(direction) + 1e-12)
        self.request_coef_, self.request_intercept_ = self._fit_tagger(acts, document, outside)
        self.n_features_in_ = X.shape[1] if hasattr(X, "shape") else np.asarray(X).shape[1]
        return self

    def _fit_tagger(self, acts, document, outside, most: int = 4000) -> tuple[np.ndarray, float]:
        """Request-token tagger on standardized activations (no request tokens seen: it tags none)."""
        if outside.sum() < 10:
            return np.zeros(acts.shape[-1]), -50.0
        from sklearn.linear_model import LogisticRegression

        from workbench.detect.shared_fits import once

        rows, cols = np.nonzero(document | outside)  # in the order acts[document | outside] gives them
        keep = np.unique(np.linspace(0, len(rows) - 1, min(most, len(rows))).round().astype(int))  # spread
        rows, cols = rows[keep], cols[keep]
        tokens, is_request = acts[rows, cols], outside[rows, cols]  # gathered without copying every token

        def fitted():
            Z = (tokens - self.mean_) / self.scale_
            fit = LogisticRegression(C=0.1, class_weight="balanced", max_iter=500).fit(Z, is_request)
            return fit.coef_[0] / self.scale_, float(fit.intercept_[0] - (self.mean_ / self.scale_) @ fit.coef_[0])

        return once("request tagger", (tokens, is_request, self.mean_, self.scale_), fitted)

    def request_tokens(self, X) -> np.ndarray:
        """Which sampled tokens the tagger takes for the user's request (none when it saw no request)."""
        acts, valid, _ = self._split(X)
        return self._tagged(acts, valid)

    def _tagged(self, acts, valid) -> np.ndarray:
        return valid & (acts @ np.asarray(self.request_coef_) + float(self.request_intercept_) > 0)

    def token_scores(self, X) -> tuple[np.ndarray, np.ndarray]:
        """Each sampled token's score along the direction, and which tokens are real (not padding)."""
        acts, valid, _ = self._split(X)
        return self._along(acts), valid

    def _along(self, acts) -> np.ndarray:
        weights = self.direction_ / self.scale_  # ((acts - mean) / scale) @ direction without the standardized copy
        return acts @ weights - self.mean_ @ weights

    def transform(self, X):
        acts, valid, _ = self._split(X)
        scores = self._along(acts)
        document = valid & ~self._tagged(acts, valid)
        valid = np.where(document.any(1, keepdims=True), document, valid)  # all tagged request: read them all
        ranked = np.sort(np.where(valid, scores, -np.inf), axis=1)[:, ::-1]
        n = valid.sum(1)
        k = np.minimum(self.top, np.maximum(n, 1))
        top = np.array([ranked[i, : k[i]].mean() if n[i] else 0.0 for i in range(len(ranked))])
        best = np.where(n > 0, ranked[:, 0], 0.0)
        mean = np.where(n > 0, np.where(valid, scores, 0).sum(1) / np.maximum(n, 1), 0.0)
        return np.c_[best, top, mean]


def _chunks(n: int, size: int = 64):
    return (slice(i, i + size) for i in range(0, n, size))
