"""Does a detector generalize? Leave one source (or one attack family) out, choose everything on the rest.

For each held-out group, every detector's layer and regularization are chosen by an inner
leave-one-group-out over the training groups only (plain 3-fold CV when there is one), the pipeline
is refitted on all training rows, and the held-out rows are scored once: AUC with a bootstrap CI,
length-matched AUC, TPR at 1% and 5% FPR, and the false-positive rate of benign near-misses at the
threshold that gives 5% FPR on the training clean rows' out-of-fold scores, and on their near-misses
(``held_out_threshold``). Text-only baselines (length, keywords) and a
last-token linear probe always sit in the same table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from workbench.detect import metrics
from workbench.detect.features import TOKEN_SAMPLE
from workbench.detect.pipelines import Detector, feature_matrix, resolve_settings
from workbench.detect.shared_fits import shared_fits
from workbench.errors import WorkbenchError

LAYER = "layer"  # placeholder in a block: the layer chosen on the training groups
C_GRID = (0.01, 0.1, 1.0)
# name -> (feature blocks, fixed settings). The reference-cloud view runs PH per row in every fit, so its C is
# fixed (one fit per layer and fold instead of three).
DETECTORS = {
    "length (baseline)": ([("text", "length")], {}),
    "keywords (baseline)": ([("text", "keywords")], {}),
    "last-token probe": ([("last", LAYER)], {}),
    "document span mean+max": ([("doc_mean", LAYER), ("doc_max", LAYER)], {}),
    "TaskTracker delta": ([("delta", LAYER)], {}),
    "delta + span mean + last": ([("delta", LAYER), ("doc_mean", LAYER), ("last", LAYER)], {}),
    "token-cloud barcode": ([("doc_topology", LAYER)], {}),
    "reference-cloud change": ([("last", LAYER)], {"reference": {"size": 48, "maxdim": 1}, "C_grid": (1.0,)}),
    "barcode + span mean+max": ([("doc_topology", LAYER), ("doc_mean", LAYER), ("doc_max", LAYER)], {}),
    # the keyword counts beside the document's activations: on garak the word list alone beat every activation view
    "span mean+max + keywords": ([("doc_mean", LAYER), ("doc_max", LAYER), ("text", "keywords")], {}),
    # a direction fitted on the inserted tokens themselves, read as the top of a document's token scores
    "injected-token probe": ([("doc_tokens", LAYER)], {"tokens": {"tokens": TOKEN_SAMPLE, "top": 4}}),
    # late fusion (fusion.LogitMean): the token probe and span + keywords, each fitted on its own columns
    "token probe + span + keywords": ([("doc_tokens", LAYER), ("doc_mean", LAYER), ("doc_max", LAYER),
                                       ("text", "keywords")],
                                      {"members": [{"blocks": 1, "tokens": {"tokens": TOKEN_SAMPLE, "top": 4}},
                                                   {"blocks": 3}]}),
    # the same three reads, each its own member: the keyword counts get the say of a whole detector (on garak the
    # word list alone beat every activation view), not two columns beside the span's 1,152
    "token probe + span + keywords (three-way)": ([("doc_tokens", LAYER), ("doc_mean", LAYER), ("doc_max", LAYER),
                                                   ("text", "keywords")],
                                                  {"members": [{"blocks": 1, "tokens": {"tokens": TOKEN_SAMPLE,
                                                                                        "top": 4}},
                                                               {"blocks": 2}, {"blocks": 1}]}),
}
# the three-way fusion with its members' say chosen too, like C: equal, or one member counted twice
# (``fusion.LogitMean``; the members' fits do not depend on it, so each option re-weighs the same fitted members)
DETECTORS["token probe + span + keywords (weighted)"] = (
    DETECTORS["token probe + span + keywords (three-way)"][0],
    {**DETECTORS["token probe + span + keywords (three-way)"][1],
     "weights_grid": ((1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2))})
SEARCHED = ("C_grid", "weights_grid")  # settings that name what the choice searches, not what a fit takes
FPR_FOR_THRESHOLD = 0.05


def fit_settings(fixed: dict, C: float | None = None, weights=None) -> dict:
    """A detector's fixed settings as a fit takes them: without the grids searched, with the chosen ``C`` and
    fusion ``weights`` (None: equal)."""
    return {**{k: v for k, v in fixed.items() if k not in SEARCHED}, **({} if C is None else {"C": C}),
            **({} if weights is None else {"weights": [float(w) for w in weights]})}


def chosen_settings(fixed: dict, pick: dict, layer=None) -> dict:
    """``fit_settings`` with what the inner choice picked: at its layer, or the best C and weights at ``layer``."""
    if layer is None or layer == pick["layer"]:
        return fit_settings(fixed, pick["C"], pick["weights"])
    return fit_settings(fixed, pick["best_C"][layer], pick["best_weights"][layer])


def _scores(det, X, options) -> dict:
    """P(injected) of ``X`` under ``det`` for each fusion weighting in ``options`` ((None,): as fitted)."""
    if options == (None,):
        return {None: det.predict_proba(X)}
    return det.pipeline.steps[-1][1].reweighed_proba(X, options)


def _blocks(template, layer):
    return [(view, layer if where == LAYER else where) for view, where in template]


def _inner_folds(groups: np.ndarray, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    names = sorted(set(groups))
    if len(names) >= 2:
        return [(groups != g, groups == g) for g in names]
    rng = np.random.default_rng(seed)
    part = rng.permutation(len(groups)) % 3
    return [(part != k, part == k) for k in range(3)]


def choose(template, acts, layers, text, y, groups, rows, seed: int = 0, fixed: dict | None = None) -> dict:
    """The layer, C (and a fusion's member weights) with the best mean inner AUC on the (training) ``rows`` only;
    ``y`` and ``groups`` are theirs. ``fixed``: settings every fit gets (``C_grid`` narrows the C searched,
    ``weights_grid`` lists a fusion's weightings). ``best_C``/``best_weights``: per layer, its best."""
    fixed = dict(fixed or {})
    grid = fixed.pop("C_grid", C_GRID)
    options = tuple(tuple(w) for w in fixed.pop("weights_grid", ())) or (None,)
    uses_layer = any(where == LAYER for _, where in template)
    best, per_layer = None, {}
    for layer in (layers if uses_layer else [None]):
        blocks = _blocks(template, layer)
        X = feature_matrix(blocks, acts, layers, text)[rows]
        resolved = resolve_settings(fixed, blocks, acts, text)
        for C in grid:
            settings = {**resolved, "C": C}
            scores = {w: [] for w in options}
            oof = {w: np.full(len(y), np.nan) for w in options}
            for fit_rows, val_rows in _inner_folds(groups, seed):
                if len(set(y[fit_rows])) < 2:
                    continue
                det = Detector("inner", blocks, settings=settings).fit(X[fit_rows], y[fit_rows])
                for w, p in _scores(det, X[val_rows], options).items():
                    oof[w][val_rows] = p  # a clean-only group: scored for the threshold
                    if len(set(y[val_rows])) == 2:
                        scores[w].append(metrics.auc(y[val_rows], p))
            for w in options:  # in grid order: a tie keeps the earlier (equal weights first)
                mean = float(np.mean(scores[w])) if scores[w] else -math.inf
                if layer not in per_layer or mean > per_layer[layer][2]:
                    per_layer[layer] = (C, w, mean)
                if best is None or mean > best["inner_auc"]:
                    best = {"layer": layer, "C": C, "weights": w, "inner_auc": mean, "oof": oof[w]}
    return {**best, "best_C": {layer: c for layer, (c, _, _) in per_layer.items()},
            "best_weights": {layer: w for layer, (_, w, _) in per_layer.items()}}


PARALLEL_MIN_ROWS = 300  # training rows below which choosing in one process beats starting a pool (~2 s)


def choose_all(detectors: dict, acts, layers, text, y, groups, rows, seed: int = 0, n_jobs: int | None = None) -> dict:
    """``choose`` for every detector (name -> (template, fixed)): ``{name: pick}``, the same picks as one call each.

    The (layer, C) candidates are independent, so with enough rows and ``n_jobs`` > 1 (default: one per core) each
    one runs in a worker process (``workbench.parallel``; the arrays are sent once per worker), the detectors'
    shared fits still fitted once (``shared_fits``: every detector at one layer and C is one piece), and the picks
    are merged in the order of one loop over layers and C: a tie keeps the earlier candidate. Detectors that read no
    layer are chosen here. Picks, C per layer and inner AUCs are the same as in one process; out-of-fold scores can
    differ in the last bit (one BLAS thread per worker)."""
    from workbench.parallel import n_workers, process_pool

    by_layer = {n: spec for n, spec in detectors.items() if any(where == LAYER for _, where in spec[0])}
    pieces = [(layer, C) for layer in layers for C in C_GRID
              if any(C in spec[1].get("C_grid", C_GRID) for spec in by_layer.values())]
    big = len(pieces) > 1 and int(np.count_nonzero(rows)) >= PARALLEL_MIN_ROWS
    jobs = n_workers(n_jobs, len(pieces)) if big else 1
    with shared_fits():
        picks = {n: choose(template, acts, layers, text, y, groups, rows, seed, fixed)
                 for n, (template, fixed) in detectors.items() if jobs == 1 or n not in by_layer}
    if jobs == 1:
        return picks
    with process_pool(jobs, _hold, ((by_layer, acts, layers, text, y, groups, rows, seed),)) as pool:
        done = [pool.submit(_choose_piece, layer, C) for layer, C in pieces]
        chosen = [future.result() for future in done]
    for name in by_layer:  # in the serial loop's order: layers, then C; strict > keeps the first of equals
        best, per_layer = None, {}
        for (layer, _), piece in zip(pieces, chosen, strict=True):
            pick = piece.get(name)
            if pick is None:
                continue
            if layer not in per_layer or pick["inner_auc"] > per_layer[layer]["inner_auc"]:
                per_layer[layer] = pick
            if best is None or pick["inner_auc"] > best["inner_auc"]:
                best = pick
        picks[name] = {**best, "best_C": {layer: p["C"] for layer, p in per_layer.items()},
                       "best_weights": {layer: p["weights"] for layer, p in per_layer.items()}}
    return {n: picks[n] for n in detectors}


_HELD: tuple = ()  # a worker's copy of choose_all's inputs (``_hold``)


def _hold(inputs: tuple) -> None:
    global _HELD
    _HELD = inputs


def _choose_piece(layer, C) -> dict:
    """Every detector of ``_HELD`` that searches ``C``, at ``layer`` and ``C`` only."""
    detectors, acts, layers, text, y, groups, rows, seed = _HELD
    i = layers.index(layer)
    at = {view: a[:, [i]] for view, a in acts.items()}
    with shared_fits():
        return {n: choose(template, at, [layer], text, y, groups, rows, seed, {**fixed, "C_grid": (C,)})
                for n, (template, fixed) in detectors.items() if C in fixed.get("C_grid", C_GRID)}


MIN_NEAR_MISSES = 20  # near-miss rows below which their own 5% quantile is noise: the pooled one alone


def held_out_threshold(pick: dict, y: np.ndarray, fallback: np.ndarray, near_miss: np.ndarray | None = None) -> float:
    """The score that flags at most ``FPR_FOR_THRESHOLD`` of the training clean rows and of the training benign
    near-misses among them, read from their out-of-fold scores (each scored by the inner fit that had not seen
    its source): in-sample scores of a model that separates its training rows put the threshold far too low for
    any prompt it has not seen.

    The near-misses get their own quantile because pooled they are a few rows among many easy clean ones: reading
    the whole user turn, the pooled threshold flagged 12.5% of the held-out generator's near-misses
    (studies/injection_detection). ``fallback``: in-sample scores, used only when no inner fold could score a
    clean row."""
    oof = pick.get("oof")
    scored = (y == 0) & np.isfinite(oof) if oof is not None else np.zeros(len(y), bool)
    if not scored.any():
        return metrics.threshold_at_fpr(fallback[y == 0], FPR_FOR_THRESHOLD)
    threshold = metrics.threshold_at_fpr(oof[scored], FPR_FOR_THRESHOLD)
    near = scored & np.asarray(near_miss, bool) if near_miss is not None else None
    if near is not None and near.sum() >= MIN_NEAR_MISSES:
        threshold = max(threshold, metrics.threshold_at_fpr(oof[near], FPR_FOR_THRESHOLD))
    return threshold


def _fit_and_score(name, template, acts, layers, text, y, train, test, settings, layer):
    """(training scores, test scores) of the detector ``template`` at ``layer``, fitted on the ``train`` rows."""
    blocks = _blocks(template, layer)
    X = feature_matrix(blocks, acts, layers, text)
    det = Detector(name, blocks, settings=resolve_settings(settings, blocks, acts, text)).fit(X[train], y[train])
    return det.predict_proba(X[train]), det.predict_proba(X[test])


def evaluate(acts: dict, text: dict, layers: list[int], labels: Sequence[int], groups: Sequence[str],
             lengths: Sequence[float], near_miss: Sequence[bool] | None = None, detectors: dict | None = None,
             n_boot: int = 1000, seed: int = 0, train_on: Sequence[str] | None = None,
             progress: bool = True) -> list[dict]:
    """One row per (held-out group, detector). ``groups`` are what is left out (sources or attack families).

    ``train_on``: fit on these groups only and test on each of the others (a transfer, e.g. from the generator
    to each AgentDojo suite) instead of leaving one group out at a time."""
    from workbench.progress import progress_bar

    y = np.asarray(labels).astype(int)
    groups, lengths = np.asarray(groups), np.asarray(lengths, dtype=float)
    near = np.zeros(len(y), bool) if near_miss is None else np.asarray(near_miss, bool)
    detectors = detectors or DETECTORS
    # a group of one class (the documentation near-misses, clean only) has no AUC: it trains in every split
    always = sorted(str(g) for g in set(groups) if len(set(y[groups == g])) < 2)
    names = sorted(set(groups) - set(always))
    if len(names) < 2:
        raise WorkbenchError(f"leave-one-out needs at least two groups with both classes, got {names}")
    train_mask = None if train_on is None else np.isin(groups, [*train_on, *always])
    if train_mask is not None and (not np.isin(groups, list(train_on)).any() or train_mask.all()):
        raise WorkbenchError(f"train_on {list(train_on)} must name some of the groups {names}, not all of them")
    held_out = [str(g) for g in names if train_mask is None or g not in set(train_on)]
    rows = []
    for held in progress_bar(held_out, desc="held-out groups", unit="group", disable=not progress):
        train, test = (groups != held if train_mask is None else train_mask), groups == held
        if len(set(y[test])) < 2 or len(set(y[train])) < 2:
            raise WorkbenchError(f"group '{held}' (or the rest) holds one class only: every group needs both")
        with shared_fits():  # detectors that share a pipeline on the same columns fit it once per split
            rows += _held_out_rows(held, detectors, acts, text, layers, y, groups, lengths, near, train, test,
                                   n_boot, seed)
    return rows


def _held_out_rows(held, detectors, acts, text, layers, y, groups, lengths, near, train, test, n_boot, seed):
    """One row per detector for the held-out group ``held`` (``train``/``test``: row masks)."""
    rows = []
    specs = {name: spec if isinstance(spec, tuple) else (spec, {}) for name, spec in detectors.items()}  # a bare
    # block list: no settings; a view that was not computed (e.g. no topology asked): not this detector
    specs = {name: spec for name, spec in specs.items() if all(view in acts or view == "text" for view, _ in spec[0])}
    picks = choose_all(specs, acts, layers, text, y[train], groups[train], train, seed)
    for name, (template, fixed) in specs.items():
        pick = picks[name]
        fit = (name, template, acts, layers, text, y, train, test)
        s_train, s = _fit_and_score(*fit, chosen_settings(fixed, pick), pick["layer"])
        # a diagnostic, not a choice: the held-out AUC had each layer been fixed (its C still chosen inside)
        at_layer = {str(at): metrics.auc(y[test], s if at == pick["layer"] else
                                         _fit_and_score(*fit, chosen_settings(fixed, pick, at), at)[1])
                    for at in pick["best_C"] if at is not None and len(layers) > 1}
        threshold = held_out_threshold(pick, y[train], s_train, near[train])
        a, lo, hi = metrics.auc_ci(y[test], s, n_boot=n_boot, seed=seed)
        lm, n_matched = metrics.length_matched_auc(y[test], s, lengths[test])
        t_near = near[test]
        rows.append({
            "held_out": held, "detector": name, "layer": pick["layer"], "C": pick["C"],
            "weights": None if pick["weights"] is None else list(pick["weights"]),
            "inner_auc": round(pick["inner_auc"], 4), "n_train": int(train.sum()), "n_test": int(test.sum()),
            "auc": a, "auc_low": lo, "auc_high": hi, "length_matched_auc": lm, "matched_pairs": n_matched,
            "tpr_at_1pct_fpr": metrics.tpr_at_fpr(y[test], s, 0.01),
            "tpr_at_5pct_fpr": metrics.tpr_at_fpr(y[test], s, 0.05),
            "fpr_clean_at_threshold": metrics.false_positive_rate(s[(y[test] == 0) & ~t_near], threshold),
            "tpr_at_threshold": float((s[y[test] == 1] > threshold).mean()),
            "near_miss_fpr": metrics.false_positive_rate(s[t_near], threshold) if t_near.any() else math.nan,
            "n_near_miss": int(t_near.sum()), "auc_at_layer": at_layer,
        })
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per detector: the mean and the worst held-out AUC and length-matched AUC over the groups."""
    out = []
    for name in dict.fromkeys(r["detector"] for r in rows):
        mine = [r for r in rows if r["detector"] == name]
        aucs = [r["auc"] for r in mine]
        lms = [r["length_matched_auc"] for r in mine if not math.isnan(r["length_matched_auc"])]
        nm = [r["near_miss_fpr"] for r in mine if not math.isnan(r["near_miss_fpr"])]
        out.append({"detector": name, "mean_auc": float(np.mean(aucs)), "min_auc": float(np.min(aucs)),
                    "mean_length_matched_auc": float(np.mean(lms)) if lms else math.nan,
                    "min_length_matched_auc": float(np.min(lms)) if lms else math.nan,
                    "mean_tpr_at_5pct_fpr": float(np.mean([r["tpr_at_5pct_fpr"] for r in mine])),
                    "near_miss_fpr": float(np.mean(nm)) if nm else math.nan,
                    "layers": sorted({r["layer"] for r in mine if r["layer"] is not None}),
                    "mean_auc_at_layer": {L: float(np.mean([r["auc_at_layer"][L] for r in mine]))
                                          for L in mine[0].get("auc_at_layer", {})}})
    return out
