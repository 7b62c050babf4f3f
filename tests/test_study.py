import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.cli_harness import assert_refused
from workbench.cli import app
from workbench.commands.study import expand, load_config, results_table, run_study, write_results
from workbench.errors import WorkbenchError

CALLS = []


def flaky(params, work):
    """A job that fails on its first attempt for odd n, and always for n == 99."""
    CALLS.append(params["n"])
    if params["n"] == 99 or (params["n"] % 2 and CALLS.count(params["n"]) == 1):
        raise RuntimeError(f"boom {params['n']}")
    return {"double": 2 * params["n"], "seed": params["seed"]}


def write_config(tmp_path, grid, job="workbench.commands.study_jobs:cloud_topology", fixed=None):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "seed": 3, "job": job, "grid": grid, "fixed": fixed or {}}))
    return path


def test_expand_is_the_cartesian_product():
    jobs = expand({"seed": 1, "fixed": {"k": 5}, "grid": {"a": [1, 2], "b": ["x", "y", "z"]}})
    assert len(jobs) == 6 and jobs[0] == {"seed": 1, "k": 5, "a": 1, "b": "x"} and jobs[-1]["b"] == "z"


def test_local_run_caches_and_retries(tmp_path):
    CALLS.clear()
    config = write_config(tmp_path, {"n": [1, 2, 99]}, job="tests.test_study:flaky")
    outcome = run_study(config, cache=tmp_path / "jobs", progress=False)
    assert [j["status"] for j in outcome["jobs"]] == ["done", "done", "failed"]
    assert outcome["jobs"][0]["attempts"] == 2 and "boom 99" in outcome["failed"][0]["error"]
    calls = len(CALLS)
    again = run_study(config, cache=tmp_path / "jobs", progress=False)
    assert len(CALLS) == calls + 2  # only the failed job is run again (with its retry)
    assert [r["double"] for r in results_table(again)] == [2, 4]
    folder = write_results(again, tmp_path / "results")
    assert (folder / "results.csv").read_text().splitlines()[0].startswith("seed,n,double")


def test_same_seed_same_numbers_and_ray_agrees(tmp_path):
    pytest.importorskip("ray")
    config = write_config(tmp_path, {"noise": [0.05, 0.2]}, fixed={"n": 60})
    local = results_table(run_study(config, cache=tmp_path / "a", progress=False))
    again = results_table(run_study(config, cache=tmp_path / "b", progress=False))
    remote = results_table(run_study(config, engine="ray", cache=tmp_path / "c", progress=False))
    assert local == again == remote
    assert local[0]["h1_count"] >= 1  # a circle has a loop


def test_bad_configs(tmp_path):
    with pytest.raises(WorkbenchError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("grid: {a: [1]}\n")
    with pytest.raises(WorkbenchError, match="needs 'job"):
        load_config(tmp_path / "bad.yaml")
    with pytest.raises(WorkbenchError, match="not found"):
        run_study(write_config(tmp_path, {"a": [1]}, job="nowhere:nothing"), cache=tmp_path / "j", progress=False)
    with pytest.raises(WorkbenchError, match="unknown engine"):
        run_study(write_config(tmp_path, {"a": [1]}), engine="slurm", progress=False)


def test_cli_study_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    config = write_config(tmp_path, {"noise": [0.1]}, fixed={"n": 40})
    result = CliRunner().invoke(app, ["study", "run", str(config), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "1/1 jobs done" in result.output
    assert json.loads((tmp_path / "r" / "results.json").read_text())["rows"][0]["noise"] == 0.1


def test_only_runs_the_matching_jobs_under_their_ids(tmp_path):
    CALLS.clear()
    config = write_config(tmp_path, {"n": [2, 4], "tag": ["a", "b"]}, job="tests.test_study:flaky")
    some = run_study(config, cache=tmp_path / "jobs", progress=False, only=["n=4", "tag=b"])
    assert [(j["params"]["n"], j["params"]["tag"]) for j in some["jobs"]] == [(4, "b")] and CALLS == [4]
    run_study(config, cache=tmp_path / "jobs", progress=False)
    assert sorted(CALLS) == [2, 2, 4, 4]  # the whole run reused the (4, b) job: 3 new jobs
    for only, message in [(["n"], "write KEY=VALUE"), (["model=x"], "has no parameter 'model'|no job of"),
                          (["n=5"], r"no job of .* has n=5 \(values: \['2', '4'\]\)")]:
        with pytest.raises(WorkbenchError, match=message):
            run_study(config, cache=tmp_path / "jobs", progress=False, only=only)
    assert_refused(["study", "run", config, "--only", "n=7", "--out", tmp_path / "r"], "no job of",
                   watch=[tmp_path])


def marker_report(outcome, out):
    """A report hook: proves write_results calls it with the outcome, after the table exists."""
    assert (out / "results.csv").exists()
    (out / "report.txt").write_text(f"{len(outcome['jobs'])} {outcome['config']['quick']}")


def test_grid_list_quick_overrides_and_report(tmp_path):
    config = {"name": "t", "seed": 2, "job": "tests.test_study:flaky", "report": "tests.test_study:marker_report",
              "grid": [{"n": [2, 4], "tag": ["a"]}, {"n": [6], "tag": ["b"]}],
              "fixed": {"opts": {"x": 1, "y": 2}, "z": 0},
              "quick": {"opts": {"y": 3}, "grid": {"n": [8]}}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    full = load_config(path)
    assert [(j["n"], j["tag"]) for j in expand(full)] == [(2, "a"), (4, "a"), (6, "b")]
    quick = load_config(path, quick=True)
    assert expand(quick) == [{"seed": 2, "opts": {"x": 1, "y": 3}, "z": 0, "n": 8}]
    outcome = run_study(path, cache=tmp_path / "jobs", progress=False, quick=True)
    write_results(outcome, tmp_path / "r")
    assert (tmp_path / "r" / "report.txt").read_text() == "1 True"
    assert json.loads((tmp_path / "r" / "results.json").read_text())["config"]["quick"] is True
    path.write_text(yaml.safe_dump({k: v for k, v in config.items() if k != "quick"}))
    with pytest.raises(WorkbenchError, match="no 'quick' section"):
        load_config(path, quick=True)


@pytest.mark.parametrize("config", sorted(Path(__file__).parents[1].glob("studies/*/config.yaml")),
                         ids=lambda p: p.parent.name)
def test_every_study_is_a_runner_config(config):
    """Each study is config + `workbench study run` + results: its job and report resolve and its grid expands."""
    from workbench.commands.study import resolve_job

    for quick in (False, True) if "quick" in yaml.safe_load(config.read_text()) else (False,):
        loaded = load_config(config, quick=quick)
        resolve_job(loaded["job"])
        if loaded.get("report"):
            resolve_job(loaded["report"])
        jobs = expand(loaded)
        assert jobs and all("model" in job and job["seed"] == loaded["seed"] for job in jobs)


def test_studies_name_saes_the_polysemantic_study_trains():
    """The quantization and sparse-attention studies read the polysemantic study's SAE by its cache name, which is
    keyed by that SAE's settings: a name no full run trains would fail hours into a job (it did once: the names
    gained their settings key after these configs were written)."""
    from workbench.commands.polysemantic import model_config, sae_name

    studies = Path(__file__).parents[1] / "studies"
    trained = {sae_name(model_config(job, job["model"]), n)
               for job in expand(load_config(studies / "polysemantic_interference" / "config.yaml"))
               for n in range(len(model_config(job, job["model"])["saes"]))}
    named = {job["sae"] for study in ("quantization", "sparse_attention")
             for job in expand(load_config(studies / study / "config.yaml")) if job.get("sae")}
    assert named and named <= trained, f"not trained by the polysemantic study: {sorted(named - trained)}"


def test_tool_studies_through_the_runner(tmp_path, monkeypatch):
    """The quantization and sparse-attention jobs and reports on the tiny model: table + per-model files."""
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    common = {"seed": 0, "grid": {"model": ["tiny"]}}
    quant = {**common, "name": "q", "job": "workbench.commands.study_jobs:quant", "report": "workbench.commands.study_jobs:quant_report",
             "fixed": {"settings": ["A8", "A4+sink"], "n_tokens": 256, "block_len": 64, "batch_size": 2,
                       "drift_blocks": 1, "split": "all", "source": str(text), "progress": False}}
    attention = {**common, "name": "a", "job": "workbench.commands.study_jobs:attention",
                 "report": "workbench.commands.study_jobs:attention_report",
                 "fixed": {"methods": ["full", "tactic:0.9", "h2o:auto"], "context": 96, "decode_steps": 4,
                           "split": "all", "source": str(text), "progress": False}}
    for config, key, n in ((quant, "setting", 3), (attention, "method", 3)):
        path = tmp_path / f"{config['name']}.yaml"
        path.write_text(yaml.safe_dump(config))
        out = write_results(run_study(path, progress=False), tmp_path / config["name"])
        table = results_table(run_study(path, progress=False))  # cached: same rows
        assert len(table) == n and table[0][key] in ("float", "full")
        record = json.loads((out / "tiny" / "results.json").read_text())
        assert [r[key] for r in record["rows"]] == [r[key] for r in table]
        assert record["config"]["quick"] is False and (out / "tiny" / "figure.html").exists()


def test_an_edit_of_the_code_is_another_version(tmp_path):
    """Study jobs are cached by versions(): the workbench's own code is in it by content, not by version string."""
    from workbench.report import tree_sha256, versions

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    before = tree_sha256([tmp_path / "pkg"])
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    edited = tree_sha256([tmp_path / "pkg"])
    (tmp_path / "pkg" / "notes.txt").write_text("not code")
    assert before != edited == tree_sha256([tmp_path / "pkg"])
    assert versions()["workbench_source"] == versions()["workbench_source"] and len(versions()["workbench_source"]) == 16
