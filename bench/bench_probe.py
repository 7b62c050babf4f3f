"""How long `workbench probe` takes, as a user runs it, against the README's budgets.

Runs the CLI in a fresh process and a fresh output folder (model load, imports, prompt generation,
capture, per-layer topology, neuron flow, report), and reads the per-stage seconds the report
records. Budgets (the issue's targets on the embedded default, 2 CPU cores): --quick <= 45 s,
the default <= 300 s; the ratios are measured time / budget (<= 1 passes).

``--dtypes float32,bfloat16`` runs each setting in both model dtypes and reports what the faster one changes
in the probe's results, layer by layer against float32: the topology and probe AUCs, Hedges' g of every
summary feature, and the features called moved (q < 0.05); beside it, the yardstick: what the float32 run's own
results move by when its activations are analysed again with another subsample seed (``noise_floor``).

    python bench/bench_probe.py [--quick] [--model smollm2-135m] [--dtypes float32[,bfloat16]]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
BUDGET_S = {"quick": 45.0, "default": 300.0}


def time_probe(model: str, quick: bool, dtype: str, noise_floor: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "probe"
        command = [str(Path(sys.executable).with_name("workbench")), "probe", "--model", model, "--out", str(out),
                   "--dtype", dtype]
        if quick:
            command.append("--quick")
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "TQDM_DISABLE": "1"})
        wall = time.perf_counter() - started
        report = json.loads((out / "report.json").read_text())
        floor = protocol_noise(out, report) if noise_floor else None
    stages = {c: r["seconds"] for c, r in report["conditions"].items()}
    staged = sum(sum(s.values()) for s in stages.values())
    config = report["config"]
    return {
        "wall_seconds": round(wall, 1), "stage_seconds": stages,
        "startup_and_report_seconds": round(wall - staged, 1),
        "n_pairs": config["n_pairs"], "layers": len(next(iter(report["conditions"].values()))["layers"]),
        "k": config["k"], "K": config["K"], "dtype": dtype, "report": report,
        **({"noise_floor": floor} if floor else {}),
    }


def protocol_noise(out: Path, report: dict) -> dict:
    """The yardstick for a dtype's deviation: what the run's own results move by when its stored activations are
    analysed again with another subsample seed, or only rounded to bfloat16 (no bfloat16 forward)."""
    import torch

    import workbench.probe.run as run
    from workbench.probe import ProbeConfig
    from workbench.store import ActivationStore

    config = ProbeConfig.from_dict(report["config"])
    exact = run.class_clouds

    def rounded(*args):
        return tuple(torch.from_numpy(c).to(torch.bfloat16).float().numpy() for c in exact(*args))

    def again(seed: int, clouds) -> dict:
        run.class_clouds = clouds
        try:
            conditions = {}
            for condition in report["conditions"]:
                store = ActivationStore(out / "stores" / condition)
                with tempfile.TemporaryDirectory() as work:
                    result = run.analyze_condition(store, condition, replace(config, seed=seed), Path(work), False)
                conditions[condition] = {"layers": {str(L): r.to_dict() for L, r in result.layers.items()}}
            return {"conditions": conditions}
        finally:
            run.class_clouds = exact

    return {"other_subsample_seed": deviation(report, again(config.seed + 1, exact)),
            "bfloat16_rounded_storage_only": deviation(report, again(config.seed, rounded))}


def deviation(reference: dict, other: dict) -> dict:
    """What ``other``'s probe results change against ``reference``'s (float32), over every condition and layer."""
    d_topo, d_rows, d_g, moved_same, layers = [], [], [], 0, 0
    for cond, ref in reference["conditions"].items():
        theirs = other["conditions"][cond]["layers"]
        for layer, a in ref["layers"].items():
            b = theirs[layer]
            d_topo.append(abs(a["auc_topology"] - b["auc_topology"]))
            d_rows.append(abs(a["auc_probe_rows"] - b["auc_probe_rows"]))
            d_g += [abs(x - y) for x, y in zip(a["g"], b["g"], strict=True)]
            moved_same += sorted(a.get("moved", [])) == sorted(b.get("moved", []))
            layers += 1
    mean = lambda v: round(sum(v) / len(v), 4)  # noqa: E731
    return {"auc_topology_max_abs_diff": round(max(d_topo), 4), "auc_topology_mean_abs_diff": mean(d_topo),
            "auc_probe_rows_max_abs_diff": round(max(d_rows), 4), "hedges_g_max_abs_diff": round(max(d_g), 3),
            "hedges_g_mean_abs_diff": mean(d_g), "layers_with_the_same_moved_features": f"{moved_same}/{layers}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--quick", action="store_true", help="time only `workbench probe --quick`")
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="model dtypes to run, comma-separated; the first is the reference of the deviation")
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    from benchutil import cpu

    results = {"model": args.model, "cpu_count": os.cpu_count(), **cpu(), "load_average_before": os.getloadavg()}
    for name in ("quick",) if args.quick else ("quick", "default"):
        runs = {}
        for dtype in dtypes:
            run = time_probe(args.model, quick=name == "quick", dtype=dtype, noise_floor=dtype == dtypes[0])
            run["budget_seconds"] = BUDGET_S[name]
            run["ratio_to_budget"] = round(run["wall_seconds"] / BUDGET_S[name], 2)
            runs[dtype] = run
            if "noise_floor" in run:
                print(f"  noise floor of the {dtype} run: {run['noise_floor']}")
            print(f"workbench probe{' --quick' if name == 'quick' else ''} --dtype {dtype}: {run['wall_seconds']:.0f} s "
                  f"wall ({run['n_pairs']} pairs, {run['layers']} layers; stages {run['stage_seconds']}) = "
                  f"{run['ratio_to_budget']:.2f}x the {BUDGET_S[name]:.0f} s budget")
        reference = runs[dtypes[0]]["report"]
        for dtype in dtypes[1:]:
            runs[dtype]["deviation_from_" + dtypes[0]] = deviation(reference, runs[dtype]["report"])
            runs[dtype]["speedup_over_" + dtypes[0]] = round(runs[dtypes[0]]["wall_seconds"] / runs[dtype]["wall_seconds"], 2)
            print(f"  {dtype} vs {dtypes[0]}: {runs[dtype]['deviation_from_' + dtypes[0]]}, "
                  f"{runs[dtype]['speedup_over_' + dtypes[0]]}x faster")
        for run in runs.values():
            del run["report"]
        results[name] = runs
    results["load_average_after"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / ("probe_quick.json" if args.quick else "probe.json")).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
