"""Does a deployed detector hold when the request moves around the document, on a source it never saw?

Almost every training turn asks first, so a detector can come to rely on where the document starts. This
evaluation trains the deployed detector (``fit_detector``, the same inner leave-one-source-out choices) under
several training settings, leaving one source out, and scores that source's pairs in every layout of
``conditions.layouts``: the AUC, the length-matched AUC, and what the detector's own threshold flags of each class.
"""

from __future__ import annotations

from workbench.errors import WorkbenchError

TRAININGS = {  # name -> DetectorConfig fields: the detector before stop 41, then each change alone and both
    "as drawn, after the first blank line": {"layouts": "as drawn", "reads": "after the first blank line"},
    "as drawn, user turn": {"layouts": "as drawn", "reads": "user turn"},
    "mixed layouts, user turn": {"layouts": "mixed", "reads": "user turn"},
}


def layout_robustness(model, held_out: str, trainings=tuple(TRAININGS), n_pairs: int = 60, test_pairs: int = 60,
                      seed: int = 0, test_seed: int = 1, n_boot: int = 1000, cache=None,
                      progress: bool = True) -> list[dict]:
    """A row per (training setting, layout) for ``held_out`` (a name of ``trained.SOURCES`` other than the
    clean-only "docs"), its detector trained on every other source with ``n_pairs`` pairs each (``seed``), its
    test pairs a fresh draw (``test_pairs``, ``test_seed``)."""
    from workbench.conditions.layouts import LAYOUTS, relaid
    from workbench.detect.metrics import labelled_metrics
    from workbench.detect.trained import (
        SOURCES,
        DetectorConfig,
        fit_detector,
        readable_pairs,
        score_prompts,
        source_records,
    )
    from workbench.models import has_chat_template

    if held_out not in SOURCES or held_out == "docs":
        usable = ", ".join(s for s in SOURCES if s != "docs")
        raise WorkbenchError(f"cannot hold out {held_out!r}: use one of {usable}")
    unknown = [t for t in trainings if t not in TRAININGS]
    if unknown or not trainings:
        raise WorkbenchError(f"unknown training {(unknown or [''])[0]!r}: use some of {'; '.join(TRAININGS)}")
    train_sources = [s for s in SOURCES if s != held_out]
    chat = bool(has_chat_template(model))
    tests, _ = readable_pairs(model, source_records([held_out], test_pairs, test_seed),
                              DetectorConfig.max_tokens, chat)
    rows = []
    for name in trainings:
        config = DetectorConfig(model=model.workbench["name"], sources=train_sources, n_pairs=n_pairs,
                                generator_pairs=n_pairs, seed=seed, **TRAININGS[name])  # every source alike
        detector = fit_detector(model, config, cache=cache, progress=progress)
        for layout in LAYOUTS:
            laid = [relaid(r, layout) for r in tests]
            scores = score_prompts(model, detector, [{"text": r["text"]} for r in laid], cache=cache,
                                   progress=progress)
            scored = [{"label": r["label"], "score": float(p), "flagged": bool(p > detector["threshold"])}
                      for r, p in zip(laid, scores, strict=True)]
            got = labelled_metrics(scored, [len(r["text"]) for r in laid], n_boot=n_boot)
            rows.append({"held_out": held_out, "training": name, "layout": layout, **got,
                         "detector": detector["pipeline"]["name"], "layer": detector["layer"],
                         "inner_auc": detector["inner_auc"], "threshold": detector["threshold"],
                         "relaid": sum(r.get("layout") == layout for r in laid)})
    return rows
