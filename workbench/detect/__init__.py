"""Injection detectors: per-prompt features of a model's activations, fitted pipelines, and their evaluation.

``views`` holds the first detector (token-cloud barcode, reference-cloud change, last-token probe, at one
layer, saved as JSON); ``features`` pools activations per prompt (last token, document-span mean/max, the
TaskTracker delta) at several layers in one pass, beside text-only baselines; ``pipelines`` are the
scikit-learn detectors over those arrays, saved as plain JSON; ``evaluate`` measures generalization
(leave-one-source-out, leave-one-family-out, length-matched AUC, TPR at low FPR, near-miss false positives).
"""

from workbench.detect.views import (
    MIN_PAIRS,
    REQUIRED,
    VIEWS,
    DetectorConfig,
    check_detector,
    content_key,
    features,
    fit_logistic,
    model_identity,
    reference_features,
    resolve_layer,
    score_logistic,
    score_prompts,
    token_features,
)

__all__ = ["MIN_PAIRS", "REQUIRED", "VIEWS", "DetectorConfig", "check_detector", "content_key", "features",
           "fit_logistic", "model_identity", "reference_features", "resolve_layer", "score_logistic", "score_prompts",
           "token_features"]
