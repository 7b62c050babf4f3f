"""``workbench detect``: train a per-prompt injection detector once (saved as plain JSON), reuse it, score prompts.

The features, the choice and the fit are ``workbench.detect.trained``; this module owns the detector's folder
and the scores file.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from workbench.detect.trained import (
    AUTO,
    REQUIRED,
    SOURCES,
    DetectorConfig,
    as_user_file,
    check_detector,
    fit_detector,
    score_prompts,
    source_records,
)
from workbench.errors import WorkbenchError
from workbench.io import write_json_atomic
from workbench.models.loading import model_identity

log = logging.getLogger(__name__)


def train_detector(model, config: DetectorConfig, out: str | Path, progress: bool = True) -> dict:
    """Fit the detector on every training source (features cached in the user cache); save ``out/detector.json``."""
    from workbench.paths import cache_dir

    detector = fit_detector(model, config, cache=cache_dir("detect-features"), progress=progress)
    write_json_atomic(Path(out) / "detector.json", detector)
    return detector


def load_detector(path: str | Path) -> dict:
    """A detector.json, checked to hold everything scoring reads (one line naming what is wrong)."""
    from workbench.detect.pipelines import Detector
    from workbench.detect.trained import FORMAT

    path = Path(path)
    if not path.exists():
        raise WorkbenchError(f"no detector at {path}: run `workbench detect --train` first")
    retrain = "re-train it with `workbench detect --train`"
    try:
        detector = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise WorkbenchError(f"{path} is not valid JSON (corrupt): {retrain}") from None
    if not isinstance(detector, dict):
        raise WorkbenchError(f"{path} is not a detector (not a JSON object): {retrain}")
    if "format" in detector and detector["format"] != FORMAT:  # an older one lacks what newer formats added
        raise WorkbenchError(f"{path} is a detector of format {detector['format']!r}, this workbench reads "
                             f"{FORMAT}: {retrain}")
    missing = [k for k in REQUIRED if k not in detector]
    if missing:
        raise WorkbenchError(f"{path} lacks {', '.join(missing)} (older or damaged detector): {retrain}")
    if not isinstance(detector["config"], dict):
        raise WorkbenchError(f"{path} has no valid config: {retrain}")
    try:
        DetectorConfig(**detector["config"])
    except TypeError as exc:
        raise WorkbenchError(f"{path} has an unknown config ({exc}): {retrain}") from None
    try:
        Detector.from_dict(detector["pipeline"])
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkbenchError(f"{path} holds a damaged pipeline ({type(exc).__name__}: {exc}): {retrain}") from None
    return detector


def detector_folder(model, layer: int | None, detector_dir: str | Path | None = None) -> Path:
    """Where this model's detector lives: ``detector_dir`` or a folder in the user cache named by model and layer."""
    from workbench.paths import cache_dir, model_folder_name

    if detector_dir is not None:
        return Path(detector_dir)
    name = model_folder_name(model.workbench["name"])
    return cache_dir("detectors") / f"{name}-L{layer if layer is not None else 'auto'}"


def trained_or_loaded(model, config: DetectorConfig, folder: Path, train: bool = False, asked: dict | None = None,
                      progress: bool = True, cached: bool = False) -> tuple[dict, bool]:
    """The detector in ``folder`` (trained now when asked or absent), checked against this model and every option
    in ``asked`` (config field -> (option, value)); returns (detector, whether it was trained now). ``cached``: the
    folder is the user cache's, so a detector there that this workbench cannot read (another format, a damaged
    file) or whose ``auto`` chose among other candidates is trained again, as any stale cache entry is; a folder
    the user named is never overwritten unasked."""
    path = Path(folder) / "detector.json"
    detector = None
    if not train and path.exists():
        try:
            detector = load_detector(path)
            if config.detector == "auto" == detector["config"].get("detector") \
                    and set(detector.get("choice") or ()) != set(AUTO):
                raise WorkbenchError(f"the detector in {folder} was chosen among "
                                     f"{', '.join(detector.get('choice') or ())}; this workbench's auto chooses "
                                     f"among {', '.join(AUTO)}: pass --train to refit it")
        except WorkbenchError as exc:
            if not cached:
                raise
            log.warning("retraining the cached detector: %s", exc)
            detector = None
    if detector is None:
        config.model = model.workbench["name"]
        return train_detector(model, config, folder, progress=progress), True
    check_detector(model, detector, config.layer)
    now = model_identity(model)["model_dtype"]
    if detector.get("model_dtype") not in (None, now):  # rounding only: bfloat16 moved AUCs by <= 0.005
        log.warning("the detector in %s was trained in %s, the model now computes in %s: scores differ by rounding "
                    "(pass --dtype %s to score as it was trained)", folder, detector["model_dtype"], now,
                    detector["model_dtype"])
    trained = {**detector["config"], "reads": detector["reads"]}  # what it reads, resolved from auto
    for key, (option, value) in (asked or {}).items():
        if value is not None and trained.get(key) != value:
            shown = ",".join(trained.get(key)) if isinstance(trained.get(key), list) else trained.get(key)
            raise WorkbenchError(f"the detector in {folder} was trained with {option} {shown}, "
                                 f"not {','.join(value) if isinstance(value, list) else value}: "
                                 "pass --train to refit it (or another --detector-dir)")
    return detector, False


def score_file(model, detector: dict, records: list[dict], out: Path, chat: bool = True) -> list[dict]:
    """Score ``records`` into ``out`` (JSONL: each record without its text, plus ``score``, ``flagged`` and
    ``truncated``: longer than the detector's ``max_tokens``, so scored on its last tokens, as in training);
    ``chat=False`` feeds raw text to a detector trained on chat-wrapped prompts."""
    from workbench.capture import normalize_prompts
    from workbench.detect.features import shown_tokens
    from workbench.io import write_jsonl
    from workbench.paths import cache_dir

    wrap = detector.get("chat", True) and chat
    scores = score_prompts(model, detector, records, cache=cache_dir("detect-work"), chat=wrap)
    cut = set(shown_tokens(model, as_user_file(normalize_prompts(records), detector["reads"]),
                           detector["config"]["max_tokens"], wrap)[3])
    rows = [{**{k: v for k, v in r.items() if k != "text"}, "score": float(p), "flagged": bool(p > detector["threshold"]),
             "truncated": i in cut} for i, (r, p) in enumerate(zip(records, scores, strict=True))]
    write_jsonl(rows, out)
    return rows


def metrics_lines(got: dict) -> list[str]:
    """``labelled_metrics`` as the lines ``workbench detect`` prints."""
    if math.isnan(got["auc"]):
        return [f"no AUC: every label in the file is of one class ({got['n']} prompts); an AUC needs both"]
    lines = [f"AUC against the file's labels: {got['auc']:.3f} (95% CI {got['auc_low']:.3f}-{got['auc_high']:.3f}; "
             f"{got['injected']} injected, {got['clean']} clean)"]
    if got["matched_pairs"]:
        lines.append(f"length-matched AUC: {got['length_matched_auc']:.3f} ({got['matched_pairs']} injected/clean "
                     "pairs within 10% of each other's length)")
    lines.append(f"true-positive rate at 1% / 5% false positives: {got['tpr_at_1pct_fpr']:.0%} / "
                 f"{got['tpr_at_5pct_fpr']:.0%}")
    lines.append(f"at the detector's threshold: {got['flagged_injected']:.0%} of injected and "
                 f"{got['flagged_clean']:.0%} of clean prompts flagged")
    return lines


# ----------------------------------------------------------------------------- generalization: `workbench detect eval`

EVAL_SOURCES = SOURCES


def run_detect_eval(model="smollm2-135m", sources=EVAL_SOURCES, n_pairs: int = 150, layers=None,
                    split: str = "source", max_tokens: int = 512, batch_size: int = 8, n_boot: int = 1000,
                    dtype: str = "float32", train_on: Sequence[str] | None = None, topology: bool = True,
                    detectors: Sequence[str] | None = None, seed: int = 0, layouts: str = "as drawn",
                    reads: str = "document", progress: bool = True) -> dict:
    """Leave-one-source-out (``split="source"``) or leave-one-family-out (``"family"``, generator only) AUCs of
    every detector and baseline; features cached in the user cache by everything they depend on. ``dtype``: the
    model's; detectors are trained and scored in one dtype, which the features' cache key and the results record
    (on this 2-core CPU with AVX512-BF16, SmolLM2's forward to layer 18 ran 2.5x faster in bfloat16, and the
    detectors' AUCs moved by at most 0.005: ``results/fused/bfloat16-*`` in studies/injection_detection).
    ``topology``: also the token-cloud barcode of every document (``TokenCloudBarcode`` with its defaults).
    ``detectors``: names of ``evaluate.DETECTORS`` to measure (None: every one). ``layouts``: the turns as each
    source draws them, "mixed" or one layout for all (``DetectorConfig.layouts``); ``reads``: "document", the span
    each source knows, or what the deployed detector reads of a user's file (``trained.READS``)."""
    from workbench.detect.evaluate import DETECTORS, evaluate, summarize
    from workbench.detect.features import TOKEN_SAMPLE, features_by_source, text_features
    from workbench.detect.trained import READS, check_layouts, laid_out, readable_pairs
    from workbench.models import has_chat_template, load_model
    from workbench.paths import cache_dir
    from workbench.topology.prompt_views import TokenCloudBarcode

    if split not in ("source", "family"):
        raise WorkbenchError(f"unknown split {split!r}: use source (leave one source out) or family")
    if split == "family":
        sources = ("generator",)
    unknown = [d for d in detectors or () if d not in DETECTORS]
    if unknown or (detectors is not None and not detectors):
        raise WorkbenchError(f"unknown detector {(unknown or [''])[0]!r}: use some of {', '.join(DETECTORS)}")
    chosen = {d: DETECTORS[d] for d in detectors} if detectors else None
    check_layouts(layouts)
    if reads not in ("document", *READS):
        raise WorkbenchError(f"unknown reads {reads!r}: use document or one of {', '.join(READS)}")
    wants_delta = any("delta" in [view for view, _ in spec[0]] for spec in (chosen or DETECTORS).values())
    if wants_delta and reads == "user turn":
        raise WorkbenchError("the TaskTracker delta needs the request apart from the document, which reading the "
                             "user turn does not give: pass --detectors without the delta ones, or another --reads")
    hooked = load_model(model, dtype=dtype) if isinstance(model, str) else model
    drawn = laid_out(source_records(sources, n_pairs, seed), layouts, seed)
    records, unread = readable_pairs(hooked, drawn if reads == "document" else as_user_file(drawn, reads), max_tokens,
                                     has_chat_template(hooked))
    n = hooked.cfg.n_layers
    layers = sorted(set(layers)) if layers else sorted({n // 5, (2 * n) // 5, n // 2, (3 * n) // 5, (4 * n) // 5})
    wants_tokens = any("doc_tokens" in [view for view, _ in spec[0]] for spec in (chosen or DETECTORS).values())
    records, acts = features_by_source(hooked, records, layers, max_tokens=max_tokens, batch_size=batch_size,
                                       delta=wants_delta, chat=has_chat_template(hooked),
                                       cache=cache_dir("detect-features"),
                                       topology=TokenCloudBarcode(seed=seed) if topology else None,
                                       tokens=TOKEN_SAMPLE if wants_tokens else None, progress=progress)
    groups = [r["source"] if split == "source" else r.get("attack_family_of_pair") or "none" for r in records]
    if train_on:  # a source name covers its parts: "agentdojo" is every suite
        train_on = sorted({g for g in groups for t in train_on if g == t or g.startswith(f"{t}:")})
    rows = evaluate(acts, text_features(records), layers, [r["label"] != "clean" for r in records], groups,
                    [len(r["text"]) for r in records], [bool(r.get("near_miss")) for r in records],
                    detectors=chosen, n_boot=n_boot, seed=seed, train_on=train_on, progress=progress)
    return {"model": model_identity(hooked), "split": split, "train_on": list(train_on) if train_on else None,
            "sources": list(sources), "n_pairs": n_pairs, "layouts": layouts, "reads": reads, "layers": layers,
            "n_records": len(records), "pairs_beyond_window": unread, "rows": rows, "summary": summarize(rows)}


def write_detect_eval(result: dict, out) -> Path:
    """``out/results.json`` (everything, with versions), ``results.csv`` (a row per held-out group and detector)
    and ``results.md`` (the per-detector summary), each written atomically."""
    from workbench.commands.tool_results import markdown_table
    from workbench.io import write_csv_atomic, write_text_atomic
    from workbench.report import versions

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "results.json", json.dumps({**result, "versions": versions()}, indent=1, default=str))
    write_csv_atomic(out / "results.csv", [_flat(r) for r in result["rows"]])
    columns = ["detector", "mean_auc", "min_auc", "mean_length_matched_auc", "min_length_matched_auc",
               "mean_tpr_at_5pct_fpr", "near_miss_fpr", "layers"]
    tested = ", ".join(sorted({r["held_out"] for r in result["rows"]}))
    how = (f"trained on {', '.join(result['train_on'])}, tested on each of {tested}" if result.get("train_on")
           else f"leave one {result['split']} out over {tested}")
    caption = f"{result['model']['model']} ({result['model']['model_dtype']}), {how}; {result['n_records']} prompts"
    text = caption + "\n\n" + markdown_table(result["summary"], columns)
    by_layer = [{"detector": r["detector"], **{f"layer {L}": v for L, v in r.get("mean_auc_at_layer", {}).items()}}
                for r in result["summary"] if r.get("mean_auc_at_layer")]
    if by_layer:  # the layer each detector would have had, fixed: a diagnostic of the choice
        text += ("\n\nMean held-out AUC with the layer fixed (C still chosen on the training sources):\n\n"
                 + markdown_table(by_layer, list(dict.fromkeys(k for r in by_layer for k in r))))
    write_text_atomic(out / "results.md", text)
    detect_eval_figure(result, out / "figure.png")
    return out


def _flat(row: dict) -> dict:
    """A results row for CSV: ``auc_at_layer`` as one column per layer."""
    return {**{k: v for k, v in row.items() if k != "auc_at_layer"},
            **{f"auc_at_layer_{L}": v for L, v in row.get("auc_at_layer", {}).items()}}


def detect_eval_figure(result: dict, path) -> None:
    """Held-out AUC (with its bootstrap CI) and length-matched AUC per detector, one panel per held-out group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workbench.io import write_atomic

    groups = list(dict.fromkeys(r["held_out"] for r in result["rows"]))
    names = list(dict.fromkeys(r["detector"] for r in result["rows"]))
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 4.2), sharey=True, squeeze=False)
    for ax, group in zip(axes[0], groups, strict=True):
        mine = {r["detector"]: r for r in result["rows"] if r["held_out"] == group}
        x = np.arange(len(names))
        auc = np.array([mine[n]["auc"] for n in names])
        err = np.array([[mine[n]["auc"] - mine[n]["auc_low"], mine[n]["auc_high"] - mine[n]["auc"]] for n in names]).T
        err = np.clip(err, 0, None)  # an AUC of 1 - 1e-16 against a CI bound of 1.0 is no negative error bar
        ax.bar(x - 0.2, auc, 0.4, yerr=err, capsize=2, label="AUC (95% CI)")
        ax.bar(x + 0.2, [mine[n]["length_matched_auc"] for n in names], 0.4, label="length-matched AUC")
        ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.axhline(0.9, color="green", lw=0.8, ls="--")
        ax.set_xticks(x, names, rotation=70, ha="right", fontsize=7)
        ax.set_title(f"held out: {group}", fontsize=9)
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("held-out AUC")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    write_atomic(Path(path), lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
