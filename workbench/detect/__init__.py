"""Injection detectors: per-prompt features of a model's activations, fitted pipelines, and their evaluation.

``features`` pools activations per prompt (last token, document-span mean/max, the TaskTracker delta, the
document's token-cloud barcode) at several layers in one pass, beside text-only baselines; ``pipelines`` are
the scikit-learn detectors over those arrays, saved as plain JSON; ``evaluate`` measures generalization
(leave-one-source-out, leave-one-family-out, length-matched AUC, TPR at low FPR, near-miss false positives);
``trained`` is the deployed detector: chosen by leave-one-source-out on its training sources, fitted, scored.
"""

from workbench.detect.trained import (
    MIN_PAIRS,
    REQUIRED,
    SOURCES,
    DetectorConfig,
    check_detector,
    content_key,
    fit_detector,
    model_identity,
    resolve_layer,
    score_prompts,
    source_records,
)

__all__ = ["MIN_PAIRS", "REQUIRED", "SOURCES", "DetectorConfig", "check_detector", "content_key", "fit_detector",
           "model_identity", "resolve_layer", "score_prompts", "source_records"]
