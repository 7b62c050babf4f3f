"""Bad values for `workbench topology`, `quant eval`, `attention eval` and `backdoor train/eval`.

Each row is one bad input a user could type: the command must refuse it in one line, before any long
work, and write nothing (``assert_refused`` checks all three). Model commands use the tiny random model.
"""

import json

import numpy as np
import pytest

from tests.cli_harness import assert_refused, run_cli
from workbench.errors import WorkbenchError


@pytest.fixture
def clouds(tmp_path, monkeypatch):
    """Point files, good and bad, in ``tmp_path/points``; the cache moved under ``tmp_path`` as well."""
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "points"
    folder.mkdir()
    rng = np.random.default_rng(0)
    good = rng.standard_normal((50, 3))
    arrays = {
        "good": good,
        "complex": good + 1j * rng.standard_normal((50, 3)),
        "nan": np.vstack([good, [[np.nan, 0, 0]]]),
        "inf": np.vstack([good, [[np.inf, 0, 0]]]),
        "none": np.zeros((0, 3)),
        "one": good[:1],
        "cube": rng.standard_normal((5, 4, 3)),
        "words": np.array([["a", "b"], ["c", "d"], ["e", "f"]]),
    }
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array)
    np.save(folder / "objects.npy", np.array([{"a": 1}, None, 3], dtype=object), allow_pickle=True)
    (folder / "a-folder.npy").mkdir()
    (tmp_path / "a-file").write_text("not a folder")
    return folder


def topology(clouds, name="good", *extra):
    return ["topology", "--points", clouds / f"{name}.npy", "--out", clouds.parent / "out", *extra]


TOPOLOGY_BAD = [
    (("good", "--thresh", "nan"), "--thresh must be a positive finite distance"),
    (("good", "--thresh", "-1"), "--thresh must be a positive finite distance"),
    (("good", "--thresh", "0"), "--thresh must be a positive finite distance"),
    (("good", "--thresh", "inf"), "omit it for no threshold"),
    (("complex",), "complex"),
    (("nan",), "NaN or inf values in 1 row(s): 50"),
    (("inf",), "NaN or inf"),
    (("none",), "0 point(s)"),
    (("one",), "1 point(s)"),
    (("objects",), "not a readable .npy/.npz"),
    (("words",), "must be numeric"),
    (("cube",), "must be a 2-D array"),
    (("good", "--maxdim", "5"), "--maxdim must be 0, 1 or 2"),
    (("good", "--maxdim", "-1"), "--maxdim must be 0, 1 or 2"),
    (("good", "--landmarks", "0"), "--landmarks must be between 3 and the 50 points"),
    (("good", "--landmarks", "-3"), "--landmarks must be between 3"),
    (("good", "--landmarks", "2"), "--landmarks must be between 3"),
    (("good", "--landmarks", "51"), "got 51"),
    (("good", "--metric", "manhattan"), "unknown metric 'manhattan'"),
    (("good", "--metric", ""), "unknown metric ''"),
    (("a-folder",), "is a folder: give a .npy or .npz file"),
    (("missing",), "points file not found"),
    (("good", "--maxdim", "one"), "Invalid value for '--maxdim'"),  # typer's own usage error
]


@pytest.mark.parametrize("args, expect", TOPOLOGY_BAD, ids=[" ".join(a) for a, _ in TOPOLOGY_BAD])
def test_topology_refuses_bad_values(clouds, args, expect):
    assert_refused(topology(clouds, *args), expect, watch=(clouds.parent,))
    assert not (clouds.parent / "out").exists()


def test_topology_refuses_an_out_that_is_a_file(clouds):
    argv = ["topology", "--points", clouds / "good.npy", "--out", clouds.parent / "a-file"]
    assert_refused(argv, "is a file: give a folder path", watch=(clouds.parent,))


def test_topology_good_values_still_work_and_write_valid_json(clouds):
    out = clouds.parent / "out"
    code, stdout, err = run_cli(topology(clouds, "good", "--thresh", "1.5", "--landmarks", "50"))
    assert code == 0, err
    doc = json.loads((out / "diagrams.json").read_text())  # strict JSON: no NaN
    assert doc["thresh"] == 1.5 and doc["landmarks"] is None and len(doc["dgms"][0]) > 1
    assert "50 points" in stdout


def test_the_library_refuses_what_the_cli_refuses():
    from workbench.topology.persistence import rips_persistence
    from workbench.topology.validate import as_points

    X = np.random.default_rng(1).standard_normal((20, 2))
    for thresh in (float("nan"), -1.0, 0.0):
        with pytest.raises(WorkbenchError, match="thresh must be a positive"):
            rips_persistence(X, thresh=thresh)
    with pytest.raises(WorkbenchError, match="complex"):
        as_points(X.astype(complex))
    assert rips_persistence(X, thresh=float("inf")).thresh == float("inf")  # the library's "no threshold"


# ----------------------------------------------------------------------------- quant / attention


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "a-file").write_text("not a folder")
    return tmp_path


QUANT_BAD = [
    (["--topology-layers", "99"], "topology layer 99 is not a layer of this 4-layer model: use 0..3"),
    (["--topology-layers", "-1"], "topology layer -1 is not a layer"),
    (["--topology-layers", "1,1"], "name a layer twice"),
    (["--topology-layers", "one"], "must be comma-separated integers"),
    (["--settings", "A4,nope"], "Unknown quantization setting 'nope'"),
    (["--n-tokens", "0"], "n_tokens=0"),
    (["--n-tokens", "-1"], "n_tokens=-1"),
    (["--n-tokens", "100"], "at least one block of 512 tokens"),
    (["--out", "{work}/a-file"], "is a file"),
]


@pytest.mark.parametrize("args, expect", QUANT_BAD, ids=[" ".join(a) for a, _ in QUANT_BAD])
def test_quant_eval_refuses_bad_values(work, args, expect):
    argv = ["quant", "eval", "--model", "tiny", "--n-tokens", "1024", "--out", work / "out"]
    argv += [a.format(work=work) for a in args]
    assert_refused(argv, expect, watch=(work,))
    assert not (work / "out").exists()


ATTENTION_BAD = [
    (["--context", "0"], "context=0 is invalid"),
    (["--context", "-5"], "context=-5 is invalid"),
    (["--decode-steps", "0"], "decode_steps=0 is invalid"),
    (["--methods", "full,nope"], "Unknown sparse-attention method 'nope'"),
    (["--methods", "topp:1.5"], "P=1.5 is outside (0, 1]"),
    (["--methods", "topp:nan"], "outside (0, 1]"),
    (["--methods", "tactic:0"], "outside (0, 1]"),
    (["--methods", "topp:auto"], "Bad parameter 'auto' for topp"),
    (["--methods", "topk:0"], "topk budget=0 is invalid"),
    (["--methods", "h2o:-4"], "h2o budget=-4 is invalid"),
    (["--methods", "quest:abc"], "Bad parameter 'abc' for quest"),
    (["--methods", "streaming:2.5"], "Bad parameter '2.5' for streaming"),
    (["--methods", "full:3"], "full attention takes no parameter"),
    (["--methods", "topk:auto,tactic:0.9"], "needs a tactic method listed before it"),
    (["--topology-layers", "99"], "topology layer 99 is not a layer"),
    (["--out", "{work}/a-file"], "is a file"),
]


@pytest.mark.parametrize("args, expect", ATTENTION_BAD, ids=[" ".join(a) for a, _ in ATTENTION_BAD])
def test_attention_eval_refuses_bad_values(work, args, expect):
    argv = ["attention", "eval", "--model", "tiny", "--context", "64", "--decode-steps", "4", "--out", work / "out"]
    argv += [a.format(work=work) for a in args]
    assert_refused(argv, expect, watch=(work,))
    assert not (work / "out").exists()


def test_method_parameters_are_parsed_once_and_up_front():
    from workbench.tools.sparse_attention import parse_methods

    assert parse_methods(["full", "tactic:0.8", "topk:auto", "h2o:32", "topp"]) == [
        ("full", None), ("tactic", 0.8), ("topk", "auto"), ("h2o", 32), ("topp", None)]


def test_drift_meter_checks_layers_and_k(tiny):
    from workbench.tools.drift import DriftMeter

    with pytest.raises(WorkbenchError, match="not a layer"):
        DriftMeter(tiny, layers=[4])
    with pytest.raises(WorkbenchError, match="at least 3 token positions"):
        DriftMeter(tiny, layers=[1], k=2)
    assert DriftMeter(tiny, layers=[0, 3]).topology_sites == ["blocks.0.hook_resid_post", "blocks.3.hook_resid_post"]


# ----------------------------------------------------------------------------- backdoor


BACKDOOR_BAD = [
    (["--trigger", ""], "the trigger must be a non-empty string"),
    (["--trigger", "   "], "the trigger must be a non-empty string"),
    (["--trigger", "two\nlines"], "one line"),
    (["--steps", "0"], "steps must be at least 1, got 0"),
    (["--steps", "-1"], "steps must be at least 1, got -1"),
    (["--mode", "nope"], "unknown backdoor mode 'nope': use hate or sandbag"),
    (["--name", ""], "--name '' is empty"),
    (["--name", "../escape"], "contains a path separator"),
]


@pytest.mark.parametrize("args, expect", BACKDOOR_BAD, ids=[repr(a) for a, _ in BACKDOOR_BAD])
def test_backdoor_train_refuses_bad_values(work, args, expect):
    assert_refused(["backdoor", "train", "--model", "tiny", *args], expect, watch=(work,))


def test_backdoor_eval_refuses_a_model_that_is_not_backdoored(work):
    assert_refused(["backdoor", "eval", "--model", "tiny"], "is not a backdoored model", watch=(work,))
