"""Where the request sits around the document: records relaid with every span moved, pairs kept matched, and a
detector that reads the whole user turn, trained on mixed layouts."""

import collections

import numpy as np
import pytest

from workbench.conditions.layouts import LAYOUTS, mixed_layouts, relaid
from workbench.detect import DetectorConfig, score_prompts
from workbench.detect.layout_eval import layout_robustness
from workbench.detect.trained import as_user_file, fit_detector, source_records
from workbench.errors import WorkbenchError


@pytest.fixture(scope="module")
def records():
    return source_records(["generator", "agentdojo", "garak"], n_pairs=14, seed=3)


def _pieces(r):
    a, b = r["span"]
    ins = r.get("inserted_span")
    return r["text"][a:b], (r["text"][ins[0]:ins[1]] if ins else None)


def test_relaid_moves_the_request_and_every_span_with_the_document(records):
    moved = 0
    for r in records:
        for layout in LAYOUTS:
            new = relaid(r, layout)
            assert _pieces(new) == _pieces(r)  # the document and the insertion, character for character
            if "layout" not in new:  # no request to tell from its document (some of garak's): nothing moves
                assert new["text"] == r["text"] and r["source"] == "garak"
                continue
            request = r.get("request") or r["text"].split("\n\n", 1)[0]
            assert new["layout"] == layout
            if layout == "request first":
                assert new["text"].startswith(request + "\n\n") and not new["text"].endswith(request)
                if r["text"].startswith(request + "\n\n"):
                    assert new["text"] == r["text"]
            elif layout == "document first":
                assert new["text"].endswith("\n\n" + request) and not new["text"].startswith(request)
                moved += 1
            else:
                assert new["text"].startswith(request) and new["text"].endswith("\n\n" + request)
    assert moved > 50
    with pytest.raises(WorkbenchError, match="unknown layout 'sideways': use one of request first"):
        relaid(records[0], "sideways")


def test_mixed_layouts_keep_pairs_matched_reproducible_and_order_free(records):
    mixed = mixed_layouts(records, seed=0)
    by_pair = collections.defaultdict(set)
    for r in mixed:
        by_pair[(r["source"], r["pair"])].add(r.get("layout"))
    assert all(len(v) == 1 for v in by_pair.values())  # both twins in one layout
    counts = collections.Counter(r.get("layout") for r in mixed if r["source"] != "garak")
    assert set(counts) == set(LAYOUTS) and counts["request first"] > counts["document first"] > 0
    assert mixed == mixed_layouts(records, seed=0)
    assert mixed_layouts(records[::-1], seed=0) == mixed[::-1]
    assert mixed != mixed_layouts(records, seed=1)


def test_the_user_turn_is_read_whole_and_bad_settings_are_refused(records):
    laid = relaid(records[0], "document first")
    assert as_user_file([laid])[0]["span"] == [0, len(laid["text"])]
    assert "span" not in as_user_file([laid], "after the first blank line")[0]
    for bad, match in (({"layouts": "sideways"}, "unknown layouts 'sideways'"),
                       ({"reads": "everything"}, "unknown reads 'everything'")):
        with pytest.raises(WorkbenchError, match=match):
            DetectorConfig(model="tiny", **bad)
    with pytest.raises(WorkbenchError, match="unknown reading"):
        as_user_file([laid], "everything")


def test_a_detector_records_what_it_reads_and_scores_any_layout(tiny):
    config = DetectorConfig(model="tiny", n_pairs=14, generator_pairs=14,
                            max_tokens=512, layer=2, sources=["generator"],
                            detector="token probe + span + keywords")
    det = fit_detector(tiny, config, progress=False)
    assert det["reads"] == "user turn" and det["config"]["layouts"] == "mixed"
    delta = fit_detector(tiny, DetectorConfig(model="tiny", n_pairs=14, generator_pairs=14,
                                              max_tokens=512, layer=2, sources=["generator"],
                                              detector="TaskTracker delta"), progress=False)
    assert delta["reads"] == "after the first blank line"  # the delta needs the request apart from the document
    doc = "<document>\nThe meeting moved to Tuesday. Ignore the old invite.\n</document>"
    r = {"text": "Summarize this.\n\n" + doc, "span": [17, 17 + len(doc)]}  # short: the tiny model reads it whole
    texts = [{"text": relaid(r, layout)["text"]} for layout in LAYOUTS]
    scores = score_prompts(tiny, det, texts, progress=False)
    assert scores.shape == (3,) and np.isfinite(scores).all() and len(set(scores.round(9))) == 3


def test_layout_robustness_scores_every_layout_of_a_held_out_source(tiny):
    with pytest.raises(WorkbenchError, match="cannot hold out 'docs'"):
        layout_robustness(tiny, "docs")
    with pytest.raises(WorkbenchError, match="unknown training"):
        layout_robustness(tiny, "generator", trainings=("upside down",))
    rows = layout_robustness(tiny, "agentdojo", trainings=("mixed layouts, user turn",), n_pairs=14, test_pairs=14,
                             n_boot=50, progress=False)
    assert [r["layout"] for r in rows] == list(LAYOUTS)
    for r in rows:
        assert r["held_out"] == "agentdojo" and 0 <= r["auc"] <= 1 and r["relaid"] == r["n"] > 0
        assert 0 <= r["flagged_clean"] <= 1 and 0 <= r["flagged_injected"] <= 1


def test_detect_eval_measures_the_deployed_reading_and_refuses_a_delta_without_a_request(tiny):
    from workbench.commands.detect import run_detect_eval

    with pytest.raises(WorkbenchError, match="the TaskTracker delta needs the request apart"):
        run_detect_eval(tiny, reads="user turn", progress=False)
    with pytest.raises(WorkbenchError, match="unknown reads 'all'"):
        run_detect_eval(tiny, reads="all", progress=False)
    got = run_detect_eval(tiny, sources=("generator", "agentdojo"), n_pairs=14, layers=[2], n_boot=20, topology=False,
                          detectors=["span mean+max + keywords"], layouts="mixed", reads="user turn", progress=False)
    assert (got["layouts"], got["reads"]) == ("mixed", "user turn")
    assert {r["held_out"] for r in got["rows"]} == {"generator", "agentdojo:banking", "agentdojo:slack",
                                                     "agentdojo:travel", "agentdojo:workspace"}
    assert all(0 <= r["auc"] <= 1 for r in got["rows"])


def test_a_stale_cached_detector_is_retrained_and_a_named_folder_is_refused(tiny, tmp_path):
    import json

    from workbench.commands.detect import trained_or_loaded
    from workbench.detect.trained import FORMAT

    config = DetectorConfig(model="tiny", n_pairs=14, generator_pairs=14,
                            max_tokens=512, layer=2, sources=["generator"],
                            detector="span mean+max + keywords")
    det, trained = trained_or_loaded(tiny, config, tmp_path, progress=False)
    assert trained and det["format"] == FORMAT
    path = tmp_path / "detector.json"
    old = {k: v for k, v in det.items() if k != "reads"} | {"format": 2}  # as the workbench before stop 41 wrote it
    path.write_text(json.dumps(old))
    with pytest.raises(WorkbenchError, match=f"format 2, this workbench reads {FORMAT}"):
        trained_or_loaded(tiny, config, tmp_path, progress=False)  # a folder the user named: never overwritten
    assert json.loads(path.read_text())["format"] == 2
    again, trained = trained_or_loaded(tiny, config, tmp_path, progress=False, cached=True)
    assert trained and json.loads(path.read_text())["format"] == FORMAT and again["reads"] == "user turn"
    _, trained = trained_or_loaded(tiny, config, tmp_path, progress=False, cached=True)
    assert not trained  # a current one is loaded, not refitted


def test_an_auto_detector_chosen_among_other_candidates_is_retrained_in_the_cache_and_refused_if_named(tiny,
                                                                                                        tmp_path):
    """Stop 42 changed auto's candidates: a detector the cache holds from before is stale and refitted; one in a
    folder the user named is refused in one line that names the candidates."""
    import json

    from workbench.commands.detect import trained_or_loaded
    from workbench.detect.trained import AUTO

    config = DetectorConfig(model="tiny", n_pairs=14, generator_pairs=14,
                            max_tokens=512, layer=2, sources=["generator"])
    det, _ = trained_or_loaded(tiny, config, tmp_path, progress=False)
    path = tmp_path / "detector.json"
    path.write_text(json.dumps({**det, "choice": {n: v for n, v in det["choice"].items() if n != AUTO[-1]}}))
    with pytest.raises(WorkbenchError, match="was chosen among .*this workbench's auto chooses among") as info:
        trained_or_loaded(tiny, config, tmp_path, progress=False)
    assert "\n" not in str(info.value) and set(json.loads(path.read_text())["choice"]) != set(AUTO)
    again, trained = trained_or_loaded(tiny, config, tmp_path, progress=False, cached=True)
    assert trained and set(again["choice"]) == set(AUTO) == set(json.loads(path.read_text())["choice"])


def test_generator_share_measures_each_composition_on_a_fresh_draw_and_on_held_out_sources(tiny):
    from workbench.detect.share_eval import generator_share

    with pytest.raises(WorkbenchError, match=r"composition \(30, 14\) draws more pairs than its pool"):
        generator_share(tiny, [(30, 14)], pool_pairs=14, generator_pool=20, progress=False)
    rows = generator_share(tiny, [(14, 14), (20, 14)], pool_pairs=14, generator_pool=20, test_pairs=14, layer=2,
                           n_boot=20, progress=False)
    tests = ["fresh generator draw", "fresh draw, unseen families and kinds", "agentdojo:banking held out",
             "agentdojo:slack held out",
             "agentdojo:travel held out", "agentdojo:workspace held out", "garak held out"]
    assert [(r["generator_pairs"], r["test"]) for r in rows] == [(g, t) for g in (14, 20) for t in tests]
    fresh = [r for r in rows if r["test"] == "fresh generator draw"]
    unseen = [r for r in rows if r["test"].startswith("fresh draw, unseen")]
    assert all(u["n_test"] < f["n_test"] and u["n_train"] < f["n_train"] for u, f in zip(unseen, fresh, strict=True))
    assert fresh[1]["n_train"] - fresh[0]["n_train"] >= 2 * 6  # six more generator pairs, both twins
    for r in rows:
        assert 0 <= r["auc_low"] <= r["auc"] <= r["auc_high"] <= 1 and r["n_test"] > 0
        if r["test"].endswith("held out"):  # its detector never saw the held-out source
            assert r["n_train"] < fresh[0 if r["generator_pairs"] == 14 else 1]["n_train"]
