"""How well scores separate injected from clean prompts, measured so that length cannot pass for detection.

``auc`` with a stratified bootstrap CI; ``length_matched_auc`` compares an injected and a clean prompt
only when their lengths differ by at most 10% (a length detector in disguise scores ~0.5 there);
``tpr_at_fpr`` reads the ROC curve at a low false-positive rate; ``false_positive_rate`` at a threshold
chosen elsewhere (on training sources) is what the near-miss set is scored with.
"""

from __future__ import annotations

import math

import numpy as np

from workbench.errors import WorkbenchError


def auc(y: np.ndarray, s: np.ndarray) -> float:
    """ROC AUC (NaN when one class is missing)."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y).astype(int)
    return float(roc_auc_score(y, s)) if 0 < y.sum() < len(y) else math.nan


def auc_ci(y: np.ndarray, s: np.ndarray, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> tuple:
    """AUC and its percentile bootstrap CI, resampling each class separately (so every resample has both)."""
    y, s = np.asarray(y).astype(int), np.asarray(s, dtype=float)
    point = auc(y, s)
    if math.isnan(point):
        return point, math.nan, math.nan
    rng = np.random.default_rng(seed)
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    boots = []
    for _ in range(n_boot):
        rows = np.r_[rng.choice(pos, len(pos)), rng.choice(neg, len(neg))]
        boots.append(_mann_whitney(s[rows][: len(pos)], s[rows][len(pos):]))
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return point, float(lo), float(hi)


def _mann_whitney(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties counted half: the AUC, by ranks."""
    from scipy.stats import rankdata

    ranks = rankdata(np.r_[pos, neg])
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def length_matched_auc(y: np.ndarray, s: np.ndarray, lengths: np.ndarray, tolerance: float = 0.10) -> tuple:
    """AUC over (injected, clean) pairs whose lengths differ by at most ``tolerance`` of the longer one.

    Returns (auc, number of matched pairs). NaN when no pair matches."""
    y, s, lengths = np.asarray(y).astype(int), np.asarray(s, dtype=float), np.asarray(lengths, dtype=float)
    sp, sn = s[y == 1], s[y == 0]
    lp, ln = lengths[y == 1], lengths[y == 0]
    if not len(sp) or not len(sn):
        return math.nan, 0
    close = np.abs(lp[:, None] - ln[None]) <= tolerance * np.maximum(lp[:, None], ln[None])
    n = int(close.sum())
    if n == 0:
        return math.nan, 0
    wins = (sp[:, None] > sn[None]).astype(float) + 0.5 * (sp[:, None] == sn[None])
    return float((wins * close).sum() / n), n


def tpr_at_fpr(y: np.ndarray, s: np.ndarray, fpr: float) -> float:
    """The true-positive rate at the largest threshold whose false-positive rate is at most ``fpr``."""
    from sklearn.metrics import roc_curve

    y = np.asarray(y).astype(int)
    if not 0 < y.sum() < len(y):
        return math.nan
    f, t, _ = roc_curve(y, s)
    return float(t[f <= fpr].max())


def threshold_at_fpr(clean_scores: np.ndarray, fpr: float) -> float:
    """The score above which at most ``fpr`` of these clean prompts fall (chosen on training data only)."""
    return float(np.quantile(np.asarray(clean_scores, dtype=float), 1 - fpr))


def false_positive_rate(clean_scores: np.ndarray, threshold: float) -> float:
    clean_scores = np.asarray(clean_scores, dtype=float)
    return float((clean_scores > threshold).mean()) if len(clean_scores) else math.nan


# the words a file's ``label`` may use for each class (compared lower-cased, with _ and - read as spaces)
CLEAN_LABELS = ("clean", "benign", "0", "false", "no", "negative", "safe", "legitimate", "normal", "none",
                "not injected", "no injection", "uninjected")
INJECTED_LABELS = ("injected", "injection", "1", "true", "yes", "positive", "attack", "malicious", "adversarial",
                   "poisoned", "unsafe", "prompt injection", "indirect injection")


def injected_labels(records: list[dict]) -> np.ndarray | None:
    """1 for each record labelled injected, 0 for clean; None when no record has a label. A label in neither word
    list, or labels on some records only, is refused in one line: a guessed class would give a silently wrong AUC."""
    have = [i for i, r in enumerate(records) if r.get("label") is not None]
    if not have:
        return None
    if len(have) < len(records):
        first = next(i for i, r in enumerate(records) if r.get("label") is None)
        raise WorkbenchError(f"record {first + 1} has no label while {len(have)} of {len(records)} do: label every "
                             "record (clean or injected) or none")
    y = np.zeros(len(records), dtype=int)
    for i, r in enumerate(records):
        word = " ".join(str(r["label"]).strip().lower().replace("_", " ").replace("-", " ").split())
        word = {"0.0": "0", "1.0": "1"}.get(word, word)  # True/False and 0/1 arrive as "true"/"false", "0"/"1"
        if word in INJECTED_LABELS:
            y[i] = 1
        elif word not in CLEAN_LABELS:
            raise WorkbenchError(f"record {i + 1} has the label {r['label']!r}, neither clean "
                                 f"({', '.join(CLEAN_LABELS)}) nor injected ({', '.join(INJECTED_LABELS)}): "
                                 "use one of these")
    return y


def labelled_metrics(rows: list[dict], lengths, n_boot: int = 1000) -> dict | None:
    """How the scores separate the file's labels (``injected_labels``), when the records have them: the AUC with
    its bootstrap CI, the length-matched AUC (pairs within 10% of each other's length in characters, as
    ``workbench detect eval`` counts it), the true-positive rate at 1% and 5% false positives, and what the
    detector's threshold flags of each class. The AUCs and rates are NaN when the labels are all of one class."""
    y = injected_labels(rows) if rows else None
    if y is None:
        return None
    s = np.array([r["score"] for r in rows], dtype=float)
    flagged = np.array([bool(r["flagged"]) for r in rows])
    a, lo, hi = auc_ci(y, s, n_boot=n_boot)
    matched, n_matched = length_matched_auc(y, s, lengths)
    return {"n": len(rows), "injected": int(y.sum()), "clean": int(len(y) - y.sum()), "auc": a, "auc_low": lo,
            "auc_high": hi, "length_matched_auc": matched, "matched_pairs": n_matched,
            "tpr_at_1pct_fpr": tpr_at_fpr(y, s, 0.01), "tpr_at_5pct_fpr": tpr_at_fpr(y, s, 0.05),
            "flagged_injected": float(flagged[y == 1].mean()) if y.any() else math.nan,
            "flagged_clean": float(flagged[y == 0].mean()) if not y.all() else math.nan}
