"""``workbench probe``: capture, analyze and report every condition into one run folder.

Every stage writes its result to ``out`` before the next starts, so an interrupted probe resumes where it
stopped (layers are cached under keys of every input, see ``workbench.probe.layer_key``).
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np

from workbench.errors import WorkbenchError
from workbench.io import check_output_folder, jsonl_text, write_json_atomic
from workbench.probe import ProbeConfig, ProbeReport, analyze_condition, condition_prompts, flow_by_class
from workbench.probe.config import MIN_POINTS

RUN_FILES = ("config.json", "report.json", "report.html", "stores", "layers")  # what a probe writes in its folder


def run_probe(model, config: ProbeConfig, out: str | Path, progress: bool = True, overwrite: bool = False,
              engine: str = "local", workers: int | None = None, address: str | None = None,
              prompts: dict[str, list[dict]] | None = None) -> ProbeReport:
    """Capture, analyze and report every condition; returns the report (also in ``out/report.json``).

    ``engine``, ``workers``, ``address``: where the captures run (``capture``'s options; the stores, and so the
    report, are the same either way).

    ``out`` holds one run: the same configuration resumes it, another one is refused unless
    ``overwrite`` (which then replaces the probe's own files there and nothing else). Everything is
    checked before the first file is written, so a refused run leaves ``out`` as it was. ``prompts``: the
    conditions' records as ``probe_prompts`` drew them (None: drawn here).
    """
    from workbench.capture import capture, replica_spec, resid_sites
    from workbench.io import write_jsonl
    from workbench.probe.figures import write_probe_html
    from workbench.report import versions

    out = Path(out)
    config.check_protocol()
    replica_spec(model, engine, workers, 0, out / "stores", address)  # a refused engine writes nothing
    sites = resid_sites(model, config.layers)
    prompts = probe_prompts(model, config) if prompts is None else prompts
    if check_run_folder(out, config, overwrite) or check_run_prompts(out, prompts, overwrite):
        # another run's files, replaced (only with ``overwrite``)
        for name in RUN_FILES:
            target = out / name
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        for old in out.glob("prompts-*.jsonl"):
            old.unlink()
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "config.json", asdict(config))
    report = ProbeReport(config=config, model=dict(getattr(model, "workbench", {"name": model.cfg.model_name})),
                         versions=versions())
    for condition, records in prompts.items():
        clock = [time.perf_counter()]
        write_jsonl(records, out / f"prompts-{condition}.jsonl")
        store = capture(model, records, sites, out / "stores" / condition, positions="last",
                        batch_size=config.batch_size, progress=progress, engine=engine, workers=workers,
                        address=address)
        clock.append(time.perf_counter())
        result = analyze_condition(store, condition, config, out / "layers" / condition, progress)
        clock.append(time.perf_counter())
        result.neuron_flow = flow_by_class(store, condition, config)
        clock.append(time.perf_counter())
        # this run's seconds per stage (a resumed run counts only what it recomputed)
        result.seconds = dict(zip(("capture", "topology", "neuron_flow"), np.diff(clock).round(2).tolist(),
                                     strict=True))
        report.conditions[condition] = result
    write_json_atomic(out / "report.json", report.to_dict())
    write_probe_html(report, out / "report.html")
    return report


def probe_prompts(model, config: ProbeConfig) -> dict[str, list[dict]]:
    """Each condition's distinct prompts, or a one-line error when too few remain for the subsample protocol."""
    prompts = {condition: condition_prompts(model, condition, config) for condition in config.conditions}
    for condition, records in prompts.items():  # repeats are dropped: the distinct prompts must still suffice
        counts = Counter(r.get("label") for r in records)
        label, smaller = min(counts.items(), key=lambda kv: kv[1])
        if len(counts) < 2 or smaller // config.n_parts < MIN_POINTS:
            raise WorkbenchError(f"{condition} has {smaller} distinct {label!r} prompts: the subsample protocol needs "
                                 f"{MIN_POINTS} per part over {config.n_parts} parts; ask for more --pairs or fewer "
                                 "parts")
    return prompts


def default_run_folder(model, config: ProbeConfig, root: Path, prompts: dict[str, list[dict]], name: str) -> Path:
    """``root/name-KEY``, KEY a hash of the settings, the model and the prompts drawn: a default run never meets
    another's results, nor a run of prompts a former generator drew (which a named ``--out`` refuses instead)."""
    from workbench.capture import resid_sites
    from workbench.models import model_identity

    return Path(root) / f"{name}-{config.key(model_identity(model, resid_sites(model, config.layers)), prompts)}"


def check_run_prompts(out: Path, prompts: dict[str, list[dict]], overwrite: bool = False) -> bool:
    """Whether ``out`` holds a run of other prompts under the same settings (the generator or the corpus it reads
    changed since): refused like other settings, before anything is written, unless ``overwrite``."""
    for condition, records in prompts.items():
        path = out / f"prompts-{condition}.jsonl"
        if not path.is_file():
            continue
        if path.read_text(encoding="utf-8") != jsonl_text(records):
            if not overwrite:
                raise WorkbenchError(f"{out} holds a probe run of other {condition} prompts with the same settings "
                                     "(the prompt generator or its corpus changed since): pass --overwrite to "
                                     "replace it, or choose another --out")
            return True
    return False


def check_run_folder(out: Path, config: ProbeConfig, overwrite: bool = False) -> bool:
    """Whether ``out`` holds a run with other settings (which only ``overwrite`` may replace; else refused).

    A new or empty folder, or one holding this same configuration, is fine (False); a file never is.
    """
    check_output_folder(out)
    saved = out / "config.json"
    if not saved.exists():
        return False
    try:
        old = json.loads(saved.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        old, differ = {}, ["config.json"]
    else:
        new = json.loads(json.dumps(asdict(config), default=str))
        differ = [k for k in new if k != "batch_size" and old.get(k) != new[k]]
    if differ and not overwrite:
        k = differ[0]
        there = f"{k}: {old.get(k)!r} there, {getattr(config, k)!r} now" if old else "its config.json is unreadable"
        raise WorkbenchError(f"{out} holds a probe run with other settings ({there}): "
                             "pass --overwrite to replace it, or choose another --out")
    return bool(differ)
