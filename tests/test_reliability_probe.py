"""The probe never reports results made from other inputs, and a refused rerun leaves the earlier run intact."""

import json

import pytest

from tests.cli_harness import assert_refused, run_cli, snapshot
from workbench.commands.probe import run_probe
from workbench.errors import WorkbenchError
from workbench.probe import ProbeConfig

SMALL = dict(model="tiny", n_pairs=20, k=10, K=4, n_parts=2, n_boot=20, n_perm=40, flow_samples=0, layers=[1],
             batch_size=16)


def test_changed_settings_recompute_cached_layers(tiny, tmp_path):
    """The user's case: the same folder, other analysis settings: layers must be recomputed, not reused."""
    first = run_probe(tiny, ProbeConfig(**SMALL), tmp_path, progress=False)
    layer = tmp_path / "layers" / "injection" / "layer-001.json"
    assert json.loads(layer.read_text())["k"] == 10
    config = ProbeConfig(**{**SMALL, "K": 6, "n_perm": 50})
    with pytest.raises(WorkbenchError, match="other settings .*--overwrite"):
        run_probe(tiny, config, tmp_path, progress=False)
    second = run_probe(tiny, config, tmp_path, progress=False, overwrite=True)
    assert second.config.K == 6
    assert second.conditions["injection"].layers[1].p_perm != first.conditions["injection"].layers[1].p_perm


def test_stale_layer_cache_is_not_trusted(tiny, tmp_path):
    """A layer file left from another configuration (e.g. an older version's run) is recomputed."""
    other = ProbeConfig(**{**SMALL, "K": 6})
    run_probe(tiny, ProbeConfig(**SMALL), tmp_path / "a", progress=False)
    own = run_probe(tiny, other, tmp_path / "b", progress=False).conditions["injection"].layers[1]
    layer = "layers/injection/layer-001.json"
    (tmp_path / "b" / layer).write_text((tmp_path / "a" / layer).read_text())  # K=4 result under a K=6 run
    again = run_probe(tiny, other, tmp_path / "b", progress=False).conditions["injection"].layers[1]
    assert again.p_perm == own.p_perm and again.key == own.key


def test_identical_rerun_resumes_and_batch_size_is_not_a_setting(tiny, tmp_path):
    run_probe(tiny, ProbeConfig(**SMALL), tmp_path, progress=False)
    layer = tmp_path / "layers" / "injection" / "layer-001.json"
    stamp = layer.stat().st_mtime_ns
    run_probe(tiny, ProbeConfig(**{**SMALL, "batch_size": 4}), tmp_path, progress=False)
    assert layer.stat().st_mtime_ns == stamp


def test_refused_rerun_leaves_the_earlier_run_intact(tmp_path):
    """`probe --seed 1 --out <seed-0 folder>`: refused before anything is written, with advice that exists."""
    out = tmp_path / "run"
    argv = ["probe", "--model", "tiny", "--quick", "--pairs", "20", "--layers", "1", "--out", str(out)]
    code, _, err = run_cli(argv)
    assert code == 0, err
    message = assert_refused([*argv, "--seed", "1"], "--overwrite", watch=(out,))
    assert "seed" in message
    before = snapshot(out)
    code, _, err = run_cli([*argv, "--seed", "1", "--overwrite"])
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["seed"] == 1 and snapshot(out) != before


def test_default_folders_are_keyed_by_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    base = ["probe", "--model", "tiny", "--quick", "--pairs", "20", "--layers", "1"]
    for extra in ([], ["--seed", "3"]):
        code, _, err = run_cli([*base, *extra])
        assert code == 0, err
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all(r.startswith("probe-tiny-quick-") for r in runs)


def test_default_folder_follows_the_prompt_generator(tmp_path, monkeypatch):
    """Stop 41's returning user: the generator's records gained a field, and `make probe` (no --out) met the
    earlier run in its default folder and refused it. The default folder is keyed by the prompts drawn, so a
    changed generator gets a folder of its own and both runs succeed; the settings alone still resume."""
    from workbench.probe import run as probe_run

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    base = ["probe", "--model", "tiny", "--quick", "--pairs", "20", "--layers", "1", "--condition", "injection"]
    code, _, err = run_cli(base)
    assert code == 0, err
    real = probe_run.get_condition

    class Annotated:  # the same texts and labels, one more metadata field per record
        def __init__(self, name):
            self.inner = real(name)

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def prompts(self, model, n_pairs, seed=0):
            return [{**r, "request": "summarize"} for r in self.inner.prompts(model, n_pairs, seed=seed)]

    monkeypatch.setattr(probe_run, "get_condition", Annotated)
    for _ in range(2):  # the second run resumes the first's folder
        code, _, err = run_cli(base)
        assert code == 0, err
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all(r.startswith("probe-tiny-quick-") for r in runs)


@pytest.mark.parametrize(("extra", "expect"), [
    (["--pairs", "0"], "--pairs must be a positive integer"),
    (["--pairs", "-4"], "--pairs must be a positive integer"),
    (["--pairs", "15"], "--pairs 20 or more"),
    (["--batch-size", "0"], "--batch-size must be a positive integer"),
    (["--seed", "-1"], "seed must be a non-negative"),
    (["--condition", "jailbreak"], "unknown condition"),
    (["--layers", "9"], "out of range"),
    (["--layers", "a,b"], "comma-separated integers"),
    (["--model", "no-such-model-xyz"], "no-such-model-xyz"),
])
def test_bad_probe_inputs(tmp_path, extra, expect):
    out = tmp_path / "run"
    assert_refused(["probe", "--model", "tiny", "--quick", "--out", str(out), *extra], expect, watch=(tmp_path,))
    assert not out.exists()


def test_out_that_is_a_file(tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("keep me")
    assert_refused(["probe", "--model", "tiny", "--quick", "--pairs", "20", "--out", str(target)], "is a file",
                   watch=(tmp_path,))


def test_repeated_prompts_are_one_point_and_too_few_distinct_ones_are_refused(tiny, tmp_path, monkeypatch):
    """A prompt repeated within its class is dropped (the same point twice would fake a zero-length H0 bar); when
    what is left is too few for the protocol, the probe says so before capturing or writing anything."""
    from workbench.probe import run as probe_run
    from workbench.probe.run import distinct_prompts

    rows = [{"text": "a", "label": "clean"}, {"text": "a", "label": "clean"}, {"text": "a", "label": "injected"},
            {"text": "b", "label": "clean"}]
    assert distinct_prompts(rows) == [rows[0], rows[2], rows[3]]

    class Repetitive:  # AgentDojo-like: every pair shares one of three clean documents
        name, adversarial_label, kinds = "injection", "injected", ()

        def prompts(self, model, n_pairs, seed=0):
            return [r for i in range(n_pairs) for r in ({"text": f"clean document {i % 3}", "label": "clean"},
                                                         {"text": f"injected {i}", "label": "injected"})]

    monkeypatch.setattr(probe_run, "get_condition", lambda name: Repetitive())
    with pytest.raises(WorkbenchError, match=r"injection has 3 distinct 'clean' prompts"):
        run_probe(tiny, ProbeConfig(**SMALL), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_a_run_of_other_prompts_with_the_same_settings_is_refused_before_anything_is_written(tmp_path):
    """The corpus the generator reads changes with what is installed: same settings, other prompts. Seen on a
    fresh install: the prompts file was rewritten, then the store refused, leaving a mixed folder."""
    from workbench.commands.probe import check_run_prompts
    from workbench.io import write_jsonl

    old = [{"text": "a", "label": "clean"}, {"text": "b", "label": "adversarial"}]
    write_jsonl(old, tmp_path / "prompts-injection.jsonl")
    before = (tmp_path / "prompts-injection.jsonl").read_bytes()
    assert check_run_prompts(tmp_path, {"injection": old}) is False  # the same prompts resume
    new = [{"text": "a", "label": "clean"}, {"text": "c", "label": "adversarial"}]
    with pytest.raises(WorkbenchError, match="other injection prompts") as info:
        check_run_prompts(tmp_path, {"injection": new})
    assert "\n" not in str(info.value)
    assert (tmp_path / "prompts-injection.jsonl").read_bytes() == before
    assert check_run_prompts(tmp_path, {"injection": new}, overwrite=True) is True
    assert check_run_prompts(tmp_path / "empty", {"injection": new}) is False
