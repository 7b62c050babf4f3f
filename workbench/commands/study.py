"""Studies as grids of independent jobs: run in-process, or hand the same jobs to Ray.

A study config (YAML) names a job function and a grid::

    name: topological_compression
    seed: 0
    job: workbench.commands.study_jobs:probe          # module:function(params: dict, work: Path) -> dict
    grid: {model: [smollm2-135m, gemma3-270m], condition: [injection]}
    fixed: {n_pairs: 300, layers: every-2}   # passed to every job
    quick: {n_pairs: 50}                     # --quick: overrides of fixed (and of grid, under "grid")
    report: workbench.commands.study_jobs:probe_report  # optional: fn(outcome, out) writes figures beside the table

``grid`` may also be a list of such mappings: the union of their products (e.g. the backdoor
condition only on the backdoored model).

Every grid point becomes a job whose id is a hash of all it depends on: its function, its
full parameters (grid point, fixed and quick values, seed), the size and time of any file a
parameter names, and the versions of the code that computes it. A finished job's result is
cached as JSON under that id (and checked against it when read), so it is recomputed only
when one of these changes; a failed job is retried, then reported with its error, and the
others still run. The engines run the same function on the same parameters, so they give
the same numbers; scheduling is Ray's, not ours.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import logging
import traceback
from pathlib import Path

from workbench.cluster import ENGINES
from workbench.errors import WorkbenchError
from workbench.io import write_csv_atomic, write_json_atomic
from workbench.paths import safe_name

log = logging.getLogger(__name__)


def load_config(path: str | Path, quick: bool = False) -> dict:
    """The config with defaults; ``quick`` applies its ``quick`` overrides (nested mappings merged one level)."""
    import yaml

    path = Path(path)
    if not path.exists():
        raise WorkbenchError(f"study config {path} does not exist")
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise WorkbenchError(f"{path} is not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise WorkbenchError(f"{path} is not a study config: it needs 'job: module:function' and a 'grid'")
    for key in ("job", "grid"):
        if key not in config:
            raise WorkbenchError(f"{path} has no '{key}': a study config needs 'job: module:function' and a 'grid'")
    config.setdefault("name", path.resolve().parent.name)
    safe_name(config["name"], f"the study name in {path}")  # it names a cache folder
    config.setdefault("seed", 0)
    config["fixed"] = config.get("fixed") or {}
    for key in ("fixed", "quick"):
        if not isinstance(config.get(key) or {}, dict):
            raise WorkbenchError(f"'{key}' in {path} must map parameter names to values")
    overrides = dict(config.pop("quick", None) or {})
    config["quick"] = bool(quick)
    if quick:
        if not overrides:
            raise WorkbenchError(f"{path} has no 'quick' section: run it without --quick")
        config["grid"] = overrides.pop("grid", config["grid"])
        for key, value in overrides.items():
            old = config["fixed"].get(key)
            config["fixed"][key] = {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
    return config


def expand(config: dict) -> list[dict]:
    """The grid's cartesian product, in config order, each with ``seed`` and the fixed parameters."""
    grid = config["grid"]
    if isinstance(grid, list) and grid:
        return [job for part in grid for job in expand({**config, "grid": part})]
    if not isinstance(grid, dict) or not grid:
        raise WorkbenchError("'grid' must map parameter names to lists of values (or be a list of such mappings)")
    keys = list(grid)
    values = [v if isinstance(v, list) else [v] for v in grid.values()]
    if any(not v for v in values):
        raise WorkbenchError("every grid parameter needs at least one value")
    jobs = []
    for combo in itertools.product(*values):
        params = {"seed": config["seed"], **config["fixed"], **dict(zip(keys, combo, strict=True))}
        jobs.append(params)
    return jobs


def job_key(job: str, params: dict) -> dict:
    """Everything a job's result depends on: its function, its full parameters, the files they name, the code."""
    from workbench.report import versions

    return {"job": job, "params": params, "files": _named_files(params), "versions": versions()}


def job_id(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _named_files(value) -> dict:
    """Size and modification time of every existing file (or file in a folder) a parameter names, e.g. a
    text ``source``: editing one recomputes the jobs that read it."""
    found = {}
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            found.update(_named_files(item))
    elif isinstance(value, str) and value.strip() and len(value) < 4096:
        path = Path(value).expanduser()
        try:
            if path.is_file():
                files = [path]
            elif path.is_dir():  # a folder of texts; bounded, should a parameter be "/"
                files = sorted(itertools.islice((p for p in path.rglob("*") if p.is_file()), 10_000))
            else:
                files = []
            found.update({str(f): [f.stat().st_size, f.stat().st_mtime_ns] for f in files})
        except OSError:  # not a usable path: a plain string
            pass
    return found


def _plain(obj):
    """``obj`` as it reads back from the JSON cache (tuples as lists, other values as text)."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def resolve_job(spec: str):
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise WorkbenchError(f"study job {spec!r} not found ({exc}): use 'package.module:function'") from None
    return fn


def _run_one(job: str, params: dict, work: str, retries: int) -> dict:
    """Run one job with retries; never raises, so one failure cannot stop the grid."""
    fn = resolve_job(job)
    error = None
    for attempt in range(retries + 1):
        try:
            result = fn(dict(params), Path(work))
            return {"status": "done", "params": params, "result": result, "attempts": attempt + 1}
        except Exception as exc:  # a job's failure is data for the report, not a crash of the study
            error = f"{type(exc).__name__}: {exc}"
            log.warning("job %s attempt %d failed: %s", params, attempt + 1, error)
            detail = traceback.format_exc(limit=3)
    return {"status": "failed", "params": params, "error": error, "traceback": detail, "attempts": retries + 1}


def run_study(
    config_path: str | Path,
    engine: str = "local",
    address: str | None = None,
    retries: int = 1,
    cache: str | Path | None = None,
    progress: bool = True,
    quick: bool = False,
    only: list[str] | None = None,
) -> dict:
    """Run every job of the study not already cached; returns {"jobs": [...], "failed": [...], "config": ...}.

    ``only``: ``KEY=VALUE`` filters; just the jobs whose parameter KEY is VALUE (as text) run and are returned,
    under the same ids as in a whole run, so a later whole run reuses them."""
    from workbench.paths import cache_dir
    from workbench.progress import progress_bar

    if engine not in ENGINES:
        raise WorkbenchError(f"unknown engine {engine!r}: use local or ray")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise WorkbenchError(f"retries must be a whole number >= 0, got {retries!r}")
    config = load_config(config_path, quick=quick)
    resolve_job(config["job"])  # fail before starting anything
    if config.get("report"):
        resolve_job(config["report"])
    jobs = select_jobs(expand(config), only or [], config_path)
    folder = Path(cache) if cache else cache_dir("studies", config["name"], "jobs")
    folder.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict] = {}
    todo = []
    keys = [job_key(config["job"], params) for params in jobs]
    for params, key in zip(jobs, keys, strict=True):
        jid = job_id(key)
        cached = _cached(folder / f"{jid}.json", key)
        if cached is not None:
            records[jid] = cached
        else:
            todo.append((jid, params))
    bar = progress_bar(total=len(jobs), initial=len(records), desc=f"study {config['name']}", unit="job", disable=not progress)
    work = str(folder.parent / "work")

    key_of = {job_id(key): key for key in keys}

    def finish(jid, outcome):
        write_json_atomic(folder / f"{jid}.json", {**outcome, "key": key_of[jid]})
        records[jid] = outcome
        bar.update(1)

    try:
        if engine == "local":
            for jid, params in todo:
                finish(jid, _run_one(config["job"], params, work, retries))
        else:
            _run_ray(config["job"], todo, work, retries, address, finish)
    finally:
        bar.close()
    ordered = [records[job_id(key)] for key in keys]
    return {"name": config["name"], "config": config, "jobs": ordered,
            "failed": [r for r in ordered if r["status"] != "done"]}


def select_jobs(jobs: list[dict], only: list[str], where) -> list[dict]:
    """The jobs matching every ``KEY=VALUE`` of ``only`` (values compared as text); refused when one is malformed,
    names no parameter, or leaves no job."""
    for spec in only:
        key, sep, value = spec.partition("=")
        if not sep or not key:
            raise WorkbenchError(f"--only {spec!r}: write KEY=VALUE, e.g. --only model=gemma3-270m")
        if not any(key in job for job in jobs):
            names = sorted({k for job in jobs for k in job})
            raise WorkbenchError(f"--only {spec!r}: no job of {where} has a parameter {key!r} (it has {names})")
        kept = [job for job in jobs if key in job and str(job[key]) == value]
        if not kept:
            seen = sorted({str(job.get(key)) for job in jobs})
            raise WorkbenchError(f"--only {spec!r}: no job of {where} has {key}={value} (values: {seen})")
        jobs = kept
    return jobs


def _cached(path: Path, key: dict) -> dict | None:
    """A finished job's record, if ``path`` holds one computed from exactly ``key`` (else it is recomputed)."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("job cache %s unreadable (%s): recomputing it", path, exc)
        return None
    if record.get("status") != "done" or record.get("key") != _plain(key):
        return None
    record.pop("key")
    return record


def _run_ray(job: str, todo: list, work: str, retries: int, address: str | None, finish) -> None:
    from workbench.cluster import ray_session

    with ray_session(address) as ray:
        remote = ray.remote(_run_one)
        pending = {remote.remote(job, params, work, retries): jid for jid, params in todo}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                finish(pending.pop(ref), ray.get(ref))


def results_table(outcome: dict) -> list[dict]:
    """One row per finished job: its parameters, then its scalar results (lists of rows are expanded)."""
    rows = []
    for record in outcome["jobs"]:
        if record["status"] != "done":
            continue
        result = record["result"]
        for row in (result if isinstance(result, list) else [result]):
            rows.append({**record["params"], **{k: v for k, v in row.items() if not isinstance(v, (dict, list))}})
    return rows


def write_results(outcome: dict, out: str | Path) -> Path:
    """``results.csv`` and ``results.json`` (config, versions) in ``out``, then the config's ``report`` if any."""
    from workbench.report import versions

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = results_table(outcome)
    write_csv_atomic(out / "results.csv", rows)
    config = outcome.get("config", {})
    write_json_atomic(out / "results.json", {"name": outcome["name"], "config": config, "versions": versions(),
                                             "rows": rows, "failed": outcome["failed"]})
    if config.get("report") and any(r["status"] == "done" for r in outcome["jobs"]):
        resolve_job(config["report"])(outcome, out)
    return out
