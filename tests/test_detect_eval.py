"""Generalization measurement for injection detectors: metrics, JSON pipelines, leave-one-group-out, features."""

import json

import numpy as np
import pytest

from workbench.detect import metrics
from workbench.detect.evaluate import DETECTORS, evaluate, summarize
from workbench.detect.pipelines import Detector
from workbench.errors import WorkbenchError


def test_length_matched_auc_sees_through_a_length_detector():
    rng = np.random.default_rng(0)
    n = 400
    y = np.r_[np.ones(n), np.zeros(n)].astype(int)
    lengths = np.r_[rng.uniform(100, 300, n), rng.uniform(80, 280, n)]  # injected a little longer
    score = lengths.copy()  # a pure length detector
    assert metrics.auc(y, score) > 0.55
    lm, pairs = metrics.length_matched_auc(y, score, lengths)
    assert pairs > 1000 and abs(lm - 0.5) < 0.1  # within 10% of each other, length says little
    real = y + rng.normal(0, 0.3, 2 * n)  # a detector that sees the content
    assert metrics.length_matched_auc(y, real, lengths)[0] > 0.9


def test_auc_ci_brackets_the_point_and_tpr_at_fpr_reads_the_curve():
    rng = np.random.default_rng(1)
    y = np.r_[np.ones(200), np.zeros(200)].astype(int)
    s = y + rng.normal(0, 1, 400)
    a, lo, hi = metrics.auc_ci(y, s, n_boot=200)
    assert lo < a < hi and 0.65 < a < 0.85
    assert metrics.tpr_at_fpr(y, s, 0.01) <= metrics.tpr_at_fpr(y, s, 0.05) <= 1
    assert metrics.tpr_at_fpr(y, np.r_[np.ones(200), np.zeros(200)], 0.0) == 1.0
    threshold = metrics.threshold_at_fpr(s[y == 0], 0.05)
    assert metrics.false_positive_rate(s[y == 0], threshold) == pytest.approx(0.05, abs=0.01)


def test_a_detector_round_trips_through_json_exactly():
    rng = np.random.default_rng(2)
    X, y = rng.normal(size=(120, 6)), rng.integers(0, 2, 120)
    for settings in ({"C": 0.5}, {"C": 1.0, "pca": 3}):
        det = Detector("d", [("last", 3)], settings=settings).fit(X, y)
        loaded = Detector.from_dict(json.loads(json.dumps(det.to_dict())))
        assert np.array_equal(loaded.predict_proba(X), det.predict_proba(X))
        assert loaded.blocks == [("last", 3)] and loaded.settings == settings
    bad = det.to_dict()
    bad["steps"][0]["class"] = "os.system"
    with pytest.raises(WorkbenchError, match="not one this workbench loads"):
        Detector.from_dict(bad)


def test_shared_fits_fit_the_fusion_member_that_a_candidate_already_fitted_once():
    """In detect --train's choice, the fusion's span member is the span + keywords candidate: one fit, not two."""
    from workbench.detect.shared_fits import shared_fits

    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(80, 6)), rng.integers(0, 2, 80)
    fused = {"C": 0.1, "members": [{"columns": [0, 2]}, {"columns": [2, 6]}]}
    with shared_fits():
        span = Detector("span", [("doc_mean", 1)], settings={"C": 0.1}).fit(X[:, 2:], y)
        fusion = Detector("fusion", [("last", 1), ("doc_mean", 1)], settings=fused).fit(X, y)
        assert fusion.pipeline.steps[0][1].members_[1] is span.pipeline
        assert fusion.pipeline.steps[0][1].members_[0] is not span.pipeline
        other_c = Detector("span", [("doc_mean", 1)], settings={"C": 1.0}).fit(X[:, 2:], y)
        other_rows = Detector("span", [("doc_mean", 1)], settings={"C": 0.1}).fit(X[:60, 2:], y[:60])
        assert other_c.pipeline is not span.pipeline and other_rows.pipeline is not span.pipeline
    alone = Detector("span", [("doc_mean", 1)], settings={"C": 0.1}).fit(X[:, 2:], y)  # outside: a fresh fit
    assert alone.pipeline is not span.pipeline
    assert np.array_equal(alone.predict_proba(X[:, 2:]), span.predict_proba(X[:, 2:]))


def test_the_token_probes_request_tagger_is_fitted_once_across_the_c_grid_and_exactly_as_alone(monkeypatch):
    """The tagger does not depend on C: inside the choice's shared_fits it is fitted once per fold, not per C, and
    what it learns is what a fit alone learns."""
    from sklearn.linear_model import LogisticRegression

    from workbench.detect.shared_fits import shared_fits
    from workbench.detect.token_probe import TokenProbe

    rng = np.random.default_rng(4)
    n, tokens, width = 40, 8, 5
    acts = rng.normal(size=(n, tokens, width))
    role = np.tile([2, 2, 0, 0, 1, 1, 0, 0], (n, 1)).astype(float)  # request, document, inserted, document
    acts[role == 2] += 4.0
    X = np.concatenate([acts, np.ones((n, tokens, 1)), role[..., None]], axis=2).reshape(n, -1)
    y = np.arange(n) % 2
    fits = []
    real_fit = LogisticRegression.fit
    monkeypatch.setattr(LogisticRegression, "fit", lambda self, *a, **k: fits.append(1) or real_fit(self, *a, **k))
    alone = TokenProbe(tokens=tokens).fit(X, y)
    assert len(fits) == 1
    with shared_fits():
        probes = [TokenProbe(tokens=tokens).fit(X, y) for _ in range(3)]  # three Cs of one fold
        other_rows = TokenProbe(tokens=tokens).fit(X[:30], y[:30])
    assert len(fits) == 3  # one for the three equal fits, one for other rows
    for probe in probes:
        assert np.array_equal(probe.request_coef_, alone.request_coef_)
        assert probe.request_intercept_ == alone.request_intercept_
    assert not np.array_equal(other_rows.request_coef_, alone.request_coef_)
    assert probes[0].request_tokens(X)[:, :2].all() and not probes[0].request_tokens(X)[:, 2:].any()


def test_fusion_weights_reweigh_the_same_fitted_members_and_round_trip():
    """A member's weight scales its standardized logit's say; the members' fits and scaling do not depend on it,
    so the choice can score every weighting from one fit. Weights ride in the detector's JSON."""
    rng = np.random.default_rng(5)
    X, y = rng.normal(size=(90, 6)), rng.integers(0, 2, 90)
    X[:, 0] += 2.0 * y  # member 0 carries the label, member 1 does not
    members = [{"columns": [0, 2]}, {"columns": [2, 6]}]
    equal = Detector("f", [("last", 1), ("doc_mean", 1)], settings={"C": 1.0, "members": members}).fit(X, y)
    ones = Detector("f", [("last", 1), ("doc_mean", 1)], settings={"C": 1.0, "members": members,
                                                                   "weights": [1, 1]}).fit(X, y)
    first = Detector("f", [("last", 1), ("doc_mean", 1)], settings={"C": 1.0, "members": members,
                                                                    "weights": [3, 0]}).fit(X, y)
    np.testing.assert_allclose(ones.predict_proba(X), equal.predict_proba(X), atol=1e-12)
    fusion = equal.pipeline.steps[0][1]
    z = fusion.standardized(X)
    np.testing.assert_allclose(first.predict_proba(X), 1 / (1 + np.exp(-z[0])), atol=1e-12)
    assert metrics.auc(y, first.predict_proba(X)) > metrics.auc(y, equal.predict_proba(X))
    loaded = Detector.from_dict(json.loads(json.dumps(first.to_dict())))
    np.testing.assert_allclose(loaded.predict_proba(X), first.predict_proba(X), atol=1e-12)
    for bad in ([1, -1], [0, 0], [1, 1, 1]):
        with pytest.raises(ValueError, match="one non-negative weight per member"):
            Detector("f", [("last", 1), ("doc_mean", 1)], settings={"C": 1.0, "members": members,
                                                                    "weights": bad}).fit(X, y)


def test_the_choice_picks_the_weighting_that_holds_out_best_and_scores_it_as_a_refit_would():
    """``choose`` with a ``weights_grid``: the informative member gets the double say, and the out-of-fold scores of
    the pick are those of detectors fitted with its weights (no refit per weighting, the same numbers)."""
    from workbench.detect.evaluate import _inner_folds, choose, chosen_settings

    rng = np.random.default_rng(6)
    n = 240
    y = rng.integers(0, 2, n)
    groups = np.repeat(["a", "b", "c"], n // 3)
    acts = {"last": rng.normal(size=(n, 1, 4)), "doc_mean": rng.normal(size=(n, 1, 4))}
    acts["last"][:, 0, 0] += 1.2 * y  # the first member's view carries the label in every group
    acts["doc_mean"][:, 0, 0] += 0.3 * y * (groups == "a")  # the second's only in one group
    template = [("last", "layer"), ("doc_mean", "layer")]
    fixed = {"members": [{"blocks": 1}, {"blocks": 1}], "weights_grid": ((1, 1), (2, 1), (1, 2)), "C_grid": (1.0,)}
    pick = choose(template, acts, [3], {}, y, groups, np.ones(n, bool), 0, fixed)
    assert tuple(pick["weights"]) == (2, 1) and pick["best_weights"] == {3: (2, 1)}
    settings = chosen_settings(fixed, pick)
    assert settings["weights"] == [2.0, 1.0] and "weights_grid" not in settings and "C_grid" not in settings
    from workbench.detect.pipelines import feature_matrix, resolve_settings

    blocks = [("last", 3), ("doc_mean", 3)]
    X = feature_matrix(blocks, acts, [3], {})
    resolved = resolve_settings(settings, blocks, acts, {})
    for fit_rows, val_rows in _inner_folds(groups, 0):
        det = Detector("f", blocks, settings=resolved).fit(X[fit_rows], y[fit_rows])
        np.testing.assert_allclose(pick["oof"][val_rows], det.predict_proba(X[val_rows]), atol=1e-12)


def _planted(seed=0, n_groups=3, n=60, d=5, layers=(1, 4)):
    """Activations where only layer 4's 'last' view carries the label, in every group, plus a length cue
    that flips sign between groups (a detector that learns length fails to generalize)."""
    rng = np.random.default_rng(seed)
    N = n_groups * n
    y = rng.integers(0, 2, N)
    groups = np.repeat([f"g{i}" for i in range(n_groups)], n)
    last = rng.normal(size=(N, len(layers), d)).astype(np.float32)
    last[:, layers.index(4), 0] += 3 * y
    flip = np.where(groups == "g0", 1.0, -1.0)
    lengths = 200 + 12 * y * flip + rng.normal(0, 4, N)
    acts = {v: last.copy() for v in ("last", "doc_mean", "doc_max", "delta")}
    text = {"length": np.log(lengths)[:, None], "keywords": rng.normal(size=(N, 2))}
    return acts, text, list(layers), y, groups, lengths


def test_leave_one_group_out_finds_the_signal_and_its_layer_not_the_length_cue():
    acts, text, layers, y, groups, lengths = _planted()
    detectors = {"length": [("text", "length")], "probe": [("last", "layer")]}
    rows = evaluate(acts, text, layers, y, groups, lengths, detectors=detectors, n_boot=50, progress=False)
    assert len(rows) == 6 and {r["held_out"] for r in rows} == {"g0", "g1", "g2"}
    probe = [r for r in rows if r["detector"] == "probe"]
    assert all(r["layer"] == 4 and r["auc"] > 0.9 and r["length_matched_auc"] > 0.85 for r in probe)
    summary = {s["detector"]: s for s in summarize(rows)}
    assert summary["length"]["min_auc"] < 0.5 < summary["probe"]["min_auc"]  # length reverses on g0
    # the per-layer diagnostic: the chosen layer's AUC is the row's, the uninformative layer is near chance
    assert all(r["auc_at_layer"]["4"] == r["auc"] and r["auc_at_layer"]["1"] < 0.75 for r in probe)
    assert summary["probe"]["mean_auc_at_layer"]["1"] < 0.75 < summary["probe"]["mean_auc_at_layer"]["4"]
    assert summary["length"]["mean_auc_at_layer"] == {}  # a text baseline reads no layer


def test_choosing_layers_in_worker_processes_gives_the_serial_picks(monkeypatch):
    """The pool only moves where each layer's candidates are fitted: same layer, C, inner AUC, out-of-fold scores
    and per-layer C for every detector, the fusion sharing its member's fits inside a worker."""
    import workbench.detect.evaluate as ev

    acts, text, layers, y, groups, _ = _planted(n=50, layers=(1, 2, 4))
    detectors = {name: ev.DETECTORS[name] for name in ("keywords (baseline)", "document span mean+max",
                                                       "span mean+max + keywords")}
    detectors["probe"] = ([("last", "layer")], {})
    every = np.ones(len(y), bool)
    serial = ev.choose_all(detectors, acts, layers, text, y, groups, every, n_jobs=1)
    monkeypatch.setattr(ev, "PARALLEL_MIN_ROWS", 0)
    pooled = ev.choose_all(detectors, acts, layers, text, y, groups, every, n_jobs=2)
    assert list(pooled) == list(detectors) and pooled["probe"]["layer"] == 4
    for name in detectors:
        a, b = serial[name], pooled[name]
        assert (a["layer"], a["C"], a["inner_auc"], a["best_C"]) == (b["layer"], b["C"], b["inner_auc"], b["best_C"])
        np.testing.assert_allclose(a["oof"], b["oof"], rtol=1e-12, atol=1e-12)  # BLAS threads: the last bit


def test_a_group_with_one_class_trains_in_every_split_and_is_never_held_out():
    """The documentation near-misses are clean only: no AUC of their own, negatives in every training set, and
    scored out of fold so the threshold sees them; with fewer than two two-class groups left, a clear refusal."""
    from workbench.detect.evaluate import choose

    acts, text, layers, y, groups, lengths = _planted()
    y = np.where(groups == "g1", 0, y)
    rows = evaluate(acts, text, layers, y, groups, lengths, detectors={"p": [("last", "layer")]}, n_boot=20,
                    progress=False)
    assert [r["held_out"] for r in rows] == ["g0", "g2"]
    assert all(r["n_train"] == int((groups != r["held_out"]).sum()) for r in rows)  # g1 in both training sets
    transfer = evaluate(acts, text, layers, y, groups, lengths, detectors={"p": [("last", "layer")]}, n_boot=20,
                        train_on=["g0"], progress=False)
    assert [r["held_out"] for r in transfer] == ["g2"] and transfer[0]["n_train"] == int((groups != "g2").sum())
    pick = choose([("last", "layer")], acts, layers, text, y, groups, np.ones(len(y), bool), fixed={"C_grid": (1.0,)})
    assert np.isfinite(pick["oof"][groups == "g1"]).all()  # scored by the fit that did not see it
    with pytest.raises(WorkbenchError, match="at least two groups with both classes"):
        evaluate(acts, text, layers, np.where(groups == "g0", y, 0), groups, lengths,
                 detectors={"l": [("text", "length")]}, progress=False)


def test_activation_features_are_cached_batch_invariant_and_delta_is_the_task_contrast(tiny, tmp_path):
    from workbench.detect.features import activation_features, document_span, task_alone

    records = [{"text": f"Summarize this.\n\nThe report {i} says sales rose.", "label": "clean"} for i in range(5)]
    assert document_span(records[0]) == (17, len(records[0]["text"]))
    assert task_alone(records[0])["text"] == "Summarize this.\n\n"
    a = activation_features(tiny, records, [1, 3], cache=tmp_path, progress=False)
    files = list(tmp_path.glob("features-*.npz"))
    assert len(files) == 1 and set(a) == {"last", "doc_mean", "doc_max", "delta"}
    assert a["last"].shape == (5, 2, tiny.cfg.d_model)
    stamp = files[0].stat().st_mtime_ns
    b = activation_features(tiny, records, [1, 3], cache=tmp_path, progress=False)
    assert files[0].stat().st_mtime_ns == stamp and all(np.array_equal(a[k], b[k]) for k in a)
    c = activation_features(tiny, records, [1, 3], batch_size=1, progress=False)
    assert all(np.allclose(a[k], c[k], atol=1e-5) for k in a)
    alone = activation_features(tiny, [task_alone(r) for r in records], [1, 3], delta=False, progress=False)
    assert np.allclose(a["delta"], a["last"] - alone["last"], atol=1e-5)
    other = activation_features(tiny, records, [1], cache=tmp_path, progress=False)  # other layers: another entry
    assert np.allclose(other["last"][:, 0], a["last"][:, 0], atol=1e-5) and len(list(tmp_path.glob("*.npz"))) == 2


def test_detect_eval_command_writes_its_tables(tmp_path, monkeypatch):
    """`workbench detect eval` end to end on the tiny model over the four AgentDojo suites."""
    from tests.cli_harness import run_cli

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    code, out, err = run_cli(["detect", "eval", "--model", "tiny", "--sources", "agentdojo", "--pairs", "6",
                              "--layers", "3", "--boot", "20", "--dtype", "float32", "--out", tmp_path / "r"])
    assert code == 0, err
    assert "TaskTracker delta" in out and "length (baseline)" in out
    assert "injected-token probe" in out and "token probe + span + keywords" in out  # the sampled-token view too
    saved = json.loads((tmp_path / "r" / "results.json").read_text())
    assert {r["held_out"] for r in saved["rows"]} == {f"agentdojo:{s}" for s in ("banking", "slack", "travel",
                                                                                 "workspace")}
    assert saved["versions"]["torch"] and (tmp_path / "r" / "results.md").read_text().count("|") > 20
    code, out, err = run_cli(["detect", "eval", "--model", "tiny", "--detectors", "last-token probe,nope",
                              "--out", tmp_path / "refused"])
    assert code != 0 and "unknown detector 'nope'" in err and not (tmp_path / "refused").exists()
    assert (tmp_path / "r" / "figure.png").stat().st_size > 10_000


def test_train_on_fits_one_group_set_and_tests_each_other_group():
    acts, text, layers, y, groups, lengths = _planted()
    rows = evaluate(acts, text, layers, y, groups, lengths, detectors={"probe": [("last", "layer")]}, n_boot=20,
                    train_on=["g0"], progress=False)
    assert [r["held_out"] for r in rows] == ["g1", "g2"] and all(r["n_train"] == 60 for r in rows)
    assert all(r["auc"] > 0.9 for r in rows)  # the planted signal transfers from g0 alone
    with pytest.raises(WorkbenchError, match="must name some of the groups"):
        evaluate(acts, text, layers, y, groups, lengths, detectors={"p": [("last", "layer")]},
                 train_on=["nope"], progress=False)


def test_the_study_job_and_report_write_one_folder_per_job(tmp_path, monkeypatch):
    from workbench.commands.study_jobs import detect_eval, detect_eval_report

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    common = {"model": "tiny", "sources": ["agentdojo"], "split": "source", "pairs": 6, "layers": [3], "boot": 20,
              "dtype": "float32", "seed": 0}
    jobs = []
    for train_on in (None, ["agentdojo:slack"]):
        params = {**common, "train_on": train_on}
        jobs.append({"status": "done", "params": params, "result": detect_eval(dict(params), tmp_path)})
    n = len(DETECTORS)  # every detector (the topology views included) per held-out suite
    assert len(jobs[0]["result"]) == 4 * n and len(jobs[1]["result"]) == 3 * n
    detect_eval_report({"jobs": jobs, "config": {"quick": False}}, tmp_path / "results")
    for tag in ("leave-one-source-out", "train-on-agentdojo-slack"):
        assert (tmp_path / "results" / tag / "results.md").exists() and (tmp_path / "results" / tag / "figure.png").exists()


def test_the_threshold_is_read_from_out_of_fold_scores_so_it_holds_on_unseen_groups():
    """Noise features: a fit separates its own rows, so an in-sample threshold flags most unseen clean rows;
    the out-of-fold threshold flags about the 5% it promises."""
    from workbench.detect.evaluate import choose, held_out_threshold

    rng = np.random.default_rng(5)
    n, d = 240, 400
    y, groups = rng.integers(0, 2, n), np.repeat(["g0", "g1", "g2", "g3"], n // 4)
    acts = {"last": rng.normal(size=(n, 1, d)).astype(np.float32)}
    train, test = groups != "g3", groups == "g3"
    pick = choose([("last", "layer")], acts, [0], {}, y[train], groups[train], train, fixed={"C_grid": (1.0,)})
    det = Detector("p", [("last", 0)], settings={"C": 1.0}).fit(acts["last"][train, 0], y[train])
    s_train, s_test = det.predict_proba(acts["last"][train, 0]), det.predict_proba(acts["last"][test, 0])
    in_sample = metrics.threshold_at_fpr(s_train[y[train] == 0], 0.05)
    out_of_fold = held_out_threshold(pick, y[train], s_train)
    unseen_clean = s_test[y[test] == 0]
    assert metrics.false_positive_rate(unseen_clean, in_sample) > 0.3
    assert metrics.false_positive_rate(unseen_clean, out_of_fold) < 0.2


def test_the_threshold_also_holds_the_near_misses_to_five_percent():
    """Near-misses score above the other clean rows: pooled, they are a few among many and the 5% quantile of all
    clean rows flags most of them; the threshold takes their own quantile too, and ignores too few of them."""
    from workbench.detect.evaluate import MIN_NEAR_MISSES, held_out_threshold

    rng = np.random.default_rng(0)
    y = np.r_[np.zeros(500, int), np.ones(200, int)]
    oof = np.r_[rng.normal(0.0, 1, 460), rng.normal(2.0, 1, 40), rng.normal(3.0, 1, 200)]
    near = np.r_[np.zeros(460, bool), np.ones(40, bool), np.zeros(200, bool)]
    pick = {"oof": oof}
    pooled = held_out_threshold(pick, y, oof)
    assert metrics.false_positive_rate(oof[near], pooled) > 0.3
    guarded = held_out_threshold(pick, y, oof, near)
    assert metrics.false_positive_rate(oof[near], guarded) <= 0.05
    assert metrics.false_positive_rate(oof[(y == 0) & ~near], guarded) <= 0.05
    few = near & (np.cumsum(near) < MIN_NEAR_MISSES)
    assert held_out_threshold(pick, y, oof, few) == pooled


def test_training_on_the_documentation_near_misses_alone_is_refused_in_one_line(tiny, monkeypatch):
    """docs is clean only: a detector trained on it alone would have no injected row."""
    from tests.test_conditions import _doc
    from workbench.detect import DetectorConfig, fit_detector

    docs = [(f"pkg{i}/mod.py", _doc(w, i)) for i, w in enumerate(["ignore", "override", "system"] * 6)]
    monkeypatch.setattr("workbench.data.corpus.keyed_documents", lambda split="heldout": docs)
    with pytest.raises(WorkbenchError, match="one class only"):
        fit_detector(tiny, DetectorConfig(model="tiny", n_pairs=14, sources=["docs"]), progress=False)
