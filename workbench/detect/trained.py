"""The deployed injection detector: chosen by leave-one-source-out on its training sources, fitted once, plain JSON.

Training draws matched clean/injected pairs from every source (the generator, each AgentDojo suite), computes
the per-prompt features of ``features`` at the candidate layers, and lets the inner leave-one-source-out of
``evaluate.choose`` pick the layer and C of each candidate detector; with ``detector="auto"`` the candidate with
the best inner AUC wins. The pipeline is refitted on every training row, and its threshold is the score that
flags 5% of the training clean rows, and 5% of the benign near-misses among them, as the inner folds scored them
(each by a fit that had not seen its source). The result is one JSON object (the pipeline as ``Detector.to_dict``, the
model it belongs to, the settings its features need), so loading it runs no code.

The detector reads a prompt the way a user's prompt file gives it, never a span only the sources know, so
training and scoring see the same thing: the whole user turn (``READS``), request and document alike in whatever
order a person wrote them. Its training pairs are laid out with the request first, after the document or on
both sides (``conditions.layouts``). A detector that reads the TaskTracker delta needs the request apart from the
document and reads the heuristic ``document_span`` (everything after the first blank line) instead.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from workbench.conditions.layouts import LAYOUTS, mixed_layouts, relaid
from workbench.errors import WorkbenchError
from workbench.models.loading import model_identity

FORMAT = 5  # 3: "reads" (the whole user turn, stop 41); 4: the threshold holds the near-misses too (stop 42);
# 5: the generator draws GENERATOR_SHARE times the pairs of every other source (stop 43)
DEFAULT_PAIRS = 40  # per source (the generator: GENERATOR_SHARE times as many), ~820 prompts, trained in ~3 min
# The generator's pairs per pair of every other source, when training does not name them. It is the varied source
# (twenty document kinds, fourteen attack families, phrasings composed from parts), where each AgentDojo suite
# or garak is a few templates, and it is data-hungry: with every other source at 60 pairs, a fresh generator
# draw's AUC grew 0.74 -> 0.81 -> 0.87 as its pairs went 60 -> 150 -> 300, and 0.70 -> 0.83 on the families and
# kinds of its held-out split left out of training, while the held-out AgentDojo suites and garak stayed
# (mean 0.945 -> 0.943). Studies of leaving one source out still draw every source alike.
GENERATOR_SHARE = 5
MIN_PAIRS = 14  # every source needs both classes in every inner fold
# "docs": benign near-misses from real documentation (clean only; in every training set, never held out), so a
# detector sees benign imperatives and "system"/"ignore"/"override" even when the generator, whose near-misses
# were the only ones, is held out (conditions.documentation)
SOURCES = ("generator", "agentdojo", "garak", "docs")
# What ``detector="auto"`` chooses among: the activation detectors. The baselines, and the topological views
# (the token-cloud barcode, alone or beside the span features, and the reference-cloud change), stay in
# `workbench detect eval` and `--detector NAME`: in studies/injection_detection they never beat the span
# features held out (barcode + span 0.901 vs span alone 0.904 leaving one source out, 0.913 vs 0.917 from the
# generator to AgentDojo, both at layer 2) and their PH would take a third of the 3-minute training budget.
# "span mean+max + keywords" joined after garak held out: the best mean (0.884) and worst (0.622) leave-one-source-out
# AUC of any detector measured (studies/injection_detection/results/span-keywords).
# The injected-token probe (the best worst-source AUC in the study, 0.775, at layer 18) is not among them: with
# layer 18 a candidate, training took 477 s (2.6x the budget) and auto still chose span + keywords (inner 0.894 vs
# 0.862 for the token probe, which reads the heuristic document span here). Ask for it by name with --layer 18.
# The late fusion of the token probe with span + keywords joined when it became the first detector over the
# issue's AUC bars leaving one source out (0.915 mean, 0.907 length-matched, at layer 18; results/fused).
# The last-token probe, TaskTracker's delta and their combination with the span left AUTO in stop 30: leaving one
# source out they held 0.832, 0.830 and 0.877 against 0.915 for the fusion (results/leave-one-source-out and
# results/fused), never won the inner choice, and the delta needed a second forward pass per prompt (the task
# without its document). Dropping them took fresh-cache training from 372 s to 338 s (bench_detect; budget 180 s).
# They stay in `workbench detect eval` and by name (--detector NAME).
# The three-way fusion (token probe, span, keywords: each its own member) took the two-way one's place in stop 42:
# reading the whole user turn it held 0.904 leaving one source out on two draws, against 0.890 and 0.887
# (garak 0.80 -> 0.87; results/fused/deployed-reading-three-way-150pairs). The two-way one stays by name.
# "span mean+max + keywords" left AUTO in stop 43: the three-way fusion holds both its reads as members and beat it
# in every inner choice since (0.908 against 0.883), and its fits were a fifth of the choice's time, which the
# generator's larger share of the training pairs needed back. It stays by name. The fusion that also chooses its
# members' weights ("(weighted)", stop 44) is not a candidate: with the generator held out, the inner folds over the
# other sources gave the span the double say, and the generator's AUC and near-misses suffered (0.681 -> 0.659,
# 1.4% -> 11.1% flagged; studies/injection_detection, results/fused/deployed-reading-weighted-150pairs).
AUTO = ("document span mean+max", "token probe + span + keywords (three-way)")
# What the pooled views of a user's prompt read. "user turn": the whole message, so the request may stand before,
# after or around the document; "after the first blank line": the heuristic document_span, which the delta needs
# (what every detector of format 2 read).
READS = ("user turn", "after the first blank line")
REQUIRED = ("format", "config", "model", "weights_sha256", "d_model", "layer", "pipeline", "threshold", "reads")


def _int(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


@dataclass
class DetectorConfig:
    """How a detector is trained; built, it is valid, so a bad value is refused before anything runs."""

    model: str = "smollm2-135m"
    detector: str = "auto"  # a name of evaluate.DETECTORS, or auto: the best of AUTO by inner leave-one-source-out
    layer: int | None = None  # None: chosen among ``layers`` on the training sources
    layers: list[int] | None = None  # candidates (None: DEFAULT_LAYERS of the model)
    sources: list[str] = field(default_factory=lambda: list(SOURCES))
    n_pairs: int = DEFAULT_PAIRS  # matched pairs per source (per AgentDojo suite)
    generator_pairs: int | None = None  # the generator's (None: GENERATOR_SHARE x n_pairs)
    max_tokens: int = 512
    seed: int = 0
    layouts: str = "mixed"  # the training turns' layouts: "mixed" (conditions.layouts), "as drawn", or one of LAYOUTS
    reads: str = "auto"  # what the pooled views read (READS); auto: the user turn, unless the delta is among them

    def __post_init__(self):
        from workbench.detect.evaluate import DETECTORS

        if not _int(self.n_pairs, MIN_PAIRS):
            raise WorkbenchError(f"--pairs must be an integer >= {MIN_PAIRS} (every source needs both classes in "
                                 f"every fold), got {self.n_pairs!r}")
        if self.generator_pairs is None:
            self.generator_pairs = GENERATOR_SHARE * self.n_pairs
        if not _int(self.generator_pairs, MIN_PAIRS):
            raise WorkbenchError(f"--generator-pairs must be an integer >= {MIN_PAIRS} (both classes in every fold), "
                                 f"got {self.generator_pairs!r}")
        if self.layer is not None and not _int(self.layer, -10**6):
            raise WorkbenchError(f"--layer must be an integer, got {self.layer!r}")
        if self.layers is not None and (not self.layers or not all(_int(v, 0) for v in self.layers)):
            raise WorkbenchError(f"layers must be a non-empty list of integers >= 0, got {self.layers!r}")
        for name, low in (("max_tokens", 8), ("seed", 0)):
            if not _int(getattr(self, name), low):
                raise WorkbenchError(f"{name} must be an integer >= {low}, got {getattr(self, name)!r}")
        if self.detector != "auto" and self.detector not in DETECTORS:
            raise WorkbenchError(f"unknown detector {self.detector!r}: use auto or one of {', '.join(DETECTORS)}")
        bad = [s for s in self.sources if s not in SOURCES]
        if bad or not self.sources:
            raise WorkbenchError(f"unknown source {(bad or [''])[0]!r}: use {', '.join(SOURCES)}")
        self.sources = list(self.sources)
        check_layouts(self.layouts)
        if self.reads != "auto" and self.reads not in READS:
            raise WorkbenchError(f"unknown reads {self.reads!r}: use auto or one of {', '.join(READS)}")


def default_layers(model) -> list[int]:
    """Candidate layers: one at a seventh of the depth and one at three fifths. On SmolLM2
    (studies/injection_detection, the per-layer tables) the pooled span detectors held out 0.87-0.88 at layers 2-4,
    where a short forward keeps scoring fast, and the token probe and its fusion need depth: 0.79-0.87 at layers
    2-6 against 0.89-0.92 at layer 18 (3/5 of 30). A fifteenth of the depth (layer 2) was a third candidate until
    stop 43: reading the whole user turn it scored what layer 4 did in the inner choice (0.851 against 0.850 for the
    fusion, 0.844 against 0.837 for the span), both below layer 18 (0.893), and it cost a third of the choice."""
    n = model.cfg.n_layers
    return sorted({max(1, n // 7), (3 * n) // 5} & set(range(n)))


def content_key(*parts) -> str:
    """A short hash of JSON-able parts: what names a cache entry after every input of its content."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolve_layer(model, layer: int | None) -> int | None:
    """``layer`` (negative counts from the end) as an index of this model, or a one-line error; None stays None."""
    if layer is None:
        return None
    n = model.cfg.n_layers
    if not -n <= layer < n:
        raise WorkbenchError(f"layer {layer} is out of range: {model.cfg.model_name} has layers 0..{n - 1}")
    return layer % n


def source_records(sources=SOURCES, n_pairs: int = 100, seed: int = 0,
                   generator_pairs: int | None = None) -> list[dict]:
    """Matched pairs from each source, tagged with ``source``: the generator, each AgentDojo suite apart
    (``agentdojo:banking`` ...), so that leaving one source out leaves out a whole environment, garak's
    latent-injection probes as one source, and ``n_pairs`` clean documentation near-misses ("docs").
    ``generator_pairs``: the generator's pairs (None: ``n_pairs``, as every other source)."""
    from workbench.conditions import get_condition

    unknown = [s for s in sources if s not in SOURCES]
    if unknown or not sources:
        raise WorkbenchError(f"unknown source {(unknown or [''])[0]!r}: use {', '.join(SOURCES)}")
    records = []
    if "generator" in sources:
        records += [{**r, "source": "generator"} for r in get_condition("injection").prompts(
            None, n_pairs if generator_pairs is None else generator_pairs, seed=seed)]
    if "agentdojo" in sources:
        from workbench.conditions.agentdojo import agentdojo_records, suite_names

        for suite in suite_names():
            records += [{**r, "source": f"agentdojo:{suite}"}
                        for r in agentdojo_records(suites=[suite], n_pairs=n_pairs, seed=seed)]
    if "garak" in sources:
        from workbench.conditions.garak import garak_records

        records += garak_records(n_pairs=n_pairs, seed=seed)
    if "docs" in sources:
        from workbench.conditions.documentation import documentation_near_misses

        records += documentation_near_misses(n_pairs, seed=seed)
    return records


def as_user_file(records: list[dict], reads: str = "user turn") -> list[dict]:
    """Records as a user's file gives them, without a known document span: the pooled views then read what
    ``reads`` says (``READS``), in training as in scoring."""
    if reads not in READS:
        raise WorkbenchError(f"unknown reading {reads!r}: use one of {', '.join(READS)}")
    bare = [{k: v for k, v in r.items() if k != "span"} for r in records]
    if reads != "user turn":
        return bare
    # the whole turn is read; a source's known document stays as ``known_span``, which only training reads (the
    # token probe learns there which tokens are the request, to leave them out of its pooling)
    return [{**b, "span": [0, len(b["text"])], **({"known_span": list(r["span"])} if r.get("span") else {})}
            for r, b in zip(records, bare, strict=True)]


def reads_of(views, asked: str = "auto") -> str:
    """What a detector with these views reads: ``asked``, or with auto the user turn unless the delta, which needs
    the request apart from the document, is among them."""
    if asked != "auto":
        return asked
    return "after the first blank line" if "delta" in set(views) else "user turn"


def check_layouts(layouts: str) -> None:
    """``layouts`` is mixed, as drawn or one of ``LAYOUTS``, or a one-line error."""
    if layouts not in ("mixed", "as drawn", *LAYOUTS):
        raise WorkbenchError(f"unknown layouts {layouts!r}: use mixed, as drawn or one of {', '.join(LAYOUTS)}")


def laid_out(records: list[dict], layouts: str, seed: int) -> list[dict]:
    if layouts == "as drawn":  # each source's own layouts (the generator puts 15% of its requests last)
        return records
    return mixed_layouts(records, seed) if layouts == "mixed" else [relaid(r, layouts) for r in records]


def readable_pairs(model, records: list[dict], max_tokens: int, chat: bool) -> tuple[list[dict], int]:
    """``records`` without the pairs whose injection lies beyond the model's window (both twins go), and how many
    pairs went: a detector is neither trained nor judged on injections the model never reads."""
    from workbench.detect.features import injection_in_view

    def twins(i: int, r: dict):
        return (r.get("source"), r["pair"]) if r.get("pair") is not None else ("row", i)

    seen = injection_in_view(model, records, max_tokens, chat)
    lost = {twins(i, r) for i, (r, ok) in enumerate(zip(records, seen, strict=True)) if not ok}
    return [r for i, r in enumerate(records) if twins(i, r) not in lost], len(lost)


def _views_of(blocks) -> set[str]:
    return {view for view, _ in blocks}


def features_for(model, records, layers, views: set[str], max_tokens: int, chat: bool, seed: int, cache=None,
                 progress: bool = True) -> dict[str, np.ndarray]:
    """The pooled features a detector reads (the delta pass and the barcodes only when its views need them)."""
    from workbench.detect.features import TOKEN_SAMPLE, activation_features
    from workbench.topology.prompt_views import TokenCloudBarcode

    # one pass for every view (the document's sampled tokens too), and the task-alone pass only for the delta
    return activation_features(model, records, layers, max_tokens=max_tokens, delta="delta" in views, chat=chat,
                               topology=TokenCloudBarcode(seed=seed) if "doc_topology" in views else None,
                               tokens=TOKEN_SAMPLE if "doc_tokens" in views else None, cache=cache, progress=progress)


def fit_detector(model, config: DetectorConfig, cache=None, progress: bool = True) -> dict:
    """Choose (detector, layer, C) by inner leave-one-source-out, refit on every row; the detector as a dict."""
    from workbench.detect import metrics
    from workbench.detect.evaluate import (
        DETECTORS,
        FPR_FOR_THRESHOLD,
        _blocks,
        choose_all,
        chosen_settings,
        held_out_threshold,
    )
    from workbench.detect.features import text_features
    from workbench.detect.pipelines import Detector, feature_matrix, resolve_settings
    from workbench.models import has_chat_template

    layer = resolve_layer(model, config.layer)
    layers = [layer] if layer is not None else sorted({resolve_layer(model, v) for v in config.layers}) \
        if config.layers else default_layers(model)
    names = AUTO if config.detector == "auto" else (config.detector,)
    chat = bool(has_chat_template(model))
    views = set().union(*(_views_of(DETECTORS[n][0]) for n in names))
    reads = reads_of(views, config.reads)
    drawn = laid_out(source_records(config.sources, config.n_pairs, config.seed, config.generator_pairs),
                     config.layouts, config.seed)
    records, unread = readable_pairs(model, as_user_file(drawn, reads), config.max_tokens, chat)
    if not records:
        raise WorkbenchError(f"every training pair's injection lies before the last {config.max_tokens} tokens the "
                             "detector reads: raise --max-tokens")
    y = np.array([r["label"] != "clean" for r in records], dtype=int)
    groups = np.array([r["source"] for r in records])
    if len(set(y)) < 2:
        raise WorkbenchError("the training prompts hold one class only: a detector needs clean and injected ones")
    acts = features_for(model, records, layers, views, config.max_tokens, chat, config.seed, cache, progress)
    text = text_features(records)
    every = np.ones(len(y), bool)  # the fusion's span member is the span + keywords candidate: fitted once per fold
    picks = choose_all({name: DETECTORS[name] for name in names}, acts, layers, text, y, groups, every, config.seed)
    name = max(picks, key=lambda n: picks[n]["inner_auc"])
    template, fixed = DETECTORS[name]
    pick = picks[name]
    blocks = _blocks(template, pick["layer"])
    X = feature_matrix(blocks, acts, layers, text)
    settings = resolve_settings(chosen_settings(fixed, pick), blocks, acts, text)
    det = Detector(name, blocks, settings=settings).fit(X, y)
    s = det.predict_proba(X)
    threshold = held_out_threshold(pick, y, s, [bool(r.get("near_miss")) for r in records])
    return {"format": FORMAT, "config": asdict(config), **model_identity(model), "chat": chat,
            "layer": pick["layer"], "views": sorted(_views_of(blocks)), "reads": reads,
            "pipeline": det.to_dict(),
            "threshold": float(threshold), "fpr_for_threshold": FPR_FOR_THRESHOLD,
            "choice": {n: {"layer": p["layer"], "C": p["C"], "inner_auc": p["inner_auc"],
                           **({} if p["weights"] is None else {"weights": list(p["weights"])})}
                       for n, p in picks.items()},
            "inner_auc": pick["inner_auc"], "train_auc": metrics.auc(y, s), "n_train": len(y),
            "pairs_beyond_window": unread,
            "sources": sorted(set(groups))}


def check_detector(model, detector: dict, layer: int | None = None) -> None:
    """The detector was trained on this model (name, weights, width) and, when asked, at this ``layer``."""
    have = model_identity(model)
    if detector["layer"] is None and layer is None:  # a text-only baseline reads no layer
        detector = {**detector, "layer": 0}
    asked = detector["layer"] if layer is None else resolve_layer(model, layer)
    same = all(detector.get(k) == have[k] for k in ("model", "weights_sha256", "d_model")) and detector["layer"] == asked
    if not same:
        weights = "" if detector.get("model") != have["model"] or detector.get("weights_sha256") == have[
            "weights_sha256"] else f" with weights {str(detector.get('weights_sha256'))[:12]}"
        raise WorkbenchError(
            f"detector was trained on {detector.get('model')}{weights} layer {detector['layer']} "
            f"(d={detector.get('d_model')}), this is {have['model']} layer {asked} (d={have['d_model']}): "
            "retrain with --train or pass --detector-dir of a detector trained on it")
    if not _int(asked, 0) or asked >= model.cfg.n_layers:
        raise WorkbenchError(f"the detector's layer {asked!r} is not a layer of {have['model']} "
                             f"(0..{model.cfg.n_layers - 1}): retrain with --train")


def score_prompts(model, detector: dict, records: list[dict], cache=None, chat: bool | None = None,
                  progress: bool = True) -> np.ndarray:
    """P(injected) per record under a trained detector (features cached under ``cache`` when given).

    ``chat``: wrap in the chat template as in training (None: as the detector was trained)."""
    from workbench.capture import normalize_prompts
    from workbench.detect.features import text_features
    from workbench.detect.pipelines import Detector, feature_matrix

    check_detector(model, detector)
    det = Detector.from_dict(detector["pipeline"])
    records = as_user_file(normalize_prompts(records), detector["reads"])
    config = detector["config"]
    chat = detector.get("chat", True) if chat is None else chat
    layer = detector["layer"] or 0
    views = set(detector["views"]) - {"text"}
    acts = features_for(model, records, [layer], views, config["max_tokens"], chat, config["seed"], cache,
                        progress) if views else {}
    p = det.predict_proba(feature_matrix(det.blocks, acts, [layer], text_features(records)))
    if not np.isfinite(p).all():
        raise WorkbenchError("the detector gave a non-finite score: the model's activations overflowed "
                             "(score in float32)")
    return p


def summary_line(detector: dict) -> str:
    """One line that says what was trained and how well it did on sources it had not seen."""
    auc = detector["inner_auc"]
    held = "n/a" if auc is None or (isinstance(auc, float) and math.isnan(auc)) else f"{auc:.3f}"
    settings = detector["pipeline"]["settings"]
    weights = f", member weights {':'.join(f'{w:g}' for w in settings['weights'])}" if settings.get("weights") else ""
    return (f"{detector['pipeline']['name']} at layer {detector['layer']} (C={settings['C']}{weights}), "
            f"{detector['n_train']} prompts from {', '.join(detector['sources'])}; "
            f"leave-one-source-out AUC {held}, threshold {detector['threshold']:.3f} "
            "(flags 5% of the training clean rows and of their near-misses, scored out of fold)")
