import json

import pytest
import yaml
from typer.testing import CliRunner

from workbench.cli import app
from workbench.errors import WorkbenchError
from workbench.study import expand, load_config, results_table, run_study, write_results

CALLS = []


def flaky(params, work):
    """A job that fails on its first attempt for odd n, and always for n == 99."""
    CALLS.append(params["n"])
    if params["n"] == 99 or (params["n"] % 2 and CALLS.count(params["n"]) == 1):
        raise RuntimeError(f"boom {params['n']}")
    return {"double": 2 * params["n"], "seed": params["seed"]}


def write_config(tmp_path, grid, job="workbench.study_jobs:cloud_topology", fixed=None):
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
