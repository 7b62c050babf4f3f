"""Fits shared between detectors: the same pipeline on the same rows is fitted once.

The inner leave-one-source-out choice fits every candidate at every layer, C and fold, and a late fusion's
span member is the very pipeline a span candidate ("document span mean+max" for the three-way fusion) fits on
the very same columns and rows: a third of ``detect --train``'s fits were such repeats. Inside
``shared_fits()``, ``fit`` keys each fit by the estimator's parameters (nested pipelines and fusion members
included) and a hash of X and y, and returns the fitted estimator it already has. Fitted estimators are only
read afterwards (scores), never refit. Inputs above ``MAX_HASHED_BYTES`` (the token probe's per-token block) are
fitted without the memo: hashing them costs about what fitting them does, and no two detectors share them. What
such a fit computes on smaller arrays that do not depend on C (the token probe's request tagger, a third of the
choice's time) goes through ``once``, the memo ``fit`` itself uses.
"""

from __future__ import annotations

import contextlib
import hashlib
from contextvars import ContextVar

import numpy as np

_MEMO: ContextVar[dict | None] = ContextVar("shared_fits", default=None)
MAX_HASHED_BYTES = 32 * 2**20


@contextlib.contextmanager
def shared_fits():
    """Within the block, ``fit`` reuses any fit already made on the same estimator parameters and data."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def signature(estimator) -> tuple:
    """The estimator's class and parameters, recursively (pipeline steps, fusion members), as a hashable key."""
    steps = getattr(estimator, "steps", None)
    if steps is not None:
        return ("Pipeline", tuple((name, signature(step)) for name, step in steps))
    params = estimator.get_params(deep=False)
    members = params.pop("members", None)
    key = tuple(sorted((k, repr(v)) for k, v in params.items()))
    if members is not None:
        key += (("members", tuple(signature(m) for m in members)),)
    return type(estimator).__name__, key


def _digest(a) -> str:
    a = np.ascontiguousarray(a)
    return f"{a.dtype}{a.shape}" + hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest()


def fit(estimator, X, y):
    """``estimator.fit(X, y)``, or the estimator fitted before on equal parameters and data (inside ``shared_fits``)."""
    if np.asarray(X).nbytes > MAX_HASHED_BYTES:
        return estimator.fit(X, y)
    return once(signature(estimator), (X, y), lambda: estimator.fit(X, y))


def once(kind, arrays: tuple, compute):
    """``compute()``, or (inside ``shared_fits``) its result from before for the same ``kind`` (any hashable) on
    equal ``arrays``: a fit repeated for every C of the grid that does not depend on C."""
    memo = _MEMO.get()
    if memo is None:
        return compute()
    key = (kind, *(_digest(a) for a in arrays))
    if key not in memo:
        memo[key] = compute()
    return memo[key]
