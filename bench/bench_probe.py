"""How long `workbench probe` takes, as a user runs it, against the README's budgets.

Runs the CLI in a fresh process and a fresh output folder (model load, imports, prompt generation,
capture, per-layer topology, neuron flow, report), and reads the per-stage seconds the report
records. Budgets (the issue's targets on the embedded default, 2 CPU cores): --quick <= 120 s,
the default <= 600 s; the ratios are measured time / budget (<= 1 passes).

    python bench/bench_probe.py [--quick] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
BUDGET_S = {"quick": 120.0, "default": 600.0}


def time_probe(model: str, quick: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "probe"
        command = [str(Path(sys.executable).with_name("workbench")), "probe", "--model", model, "--out", str(out)]
        if quick:
            command.append("--quick")
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "TQDM_DISABLE": "1"})
        wall = time.perf_counter() - started
        report = json.loads((out / "report.json").read_text())
    stages = {c: r["seconds"] for c, r in report["conditions"].items()}
    staged = sum(sum(s.values()) for s in stages.values())
    config = report["config"]
    return {
        "wall_seconds": round(wall, 1), "stage_seconds": stages,
        "startup_and_report_seconds": round(wall - staged, 1),
        "n_pairs": config["n_pairs"], "layers": len(next(iter(report["conditions"].values()))["layers"]),
        "k": config["k"], "K": config["K"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--quick", action="store_true", help="time only `workbench probe --quick`")
    args = parser.parse_args()
    results = {"model": args.model, "cpu_count": os.cpu_count(), "load_average_before": os.getloadavg()}
    for name in ("quick",) if args.quick else ("quick", "default"):
        run = time_probe(args.model, quick=name == "quick")
        run["budget_seconds"] = BUDGET_S[name]
        run["ratio_to_budget"] = round(run["wall_seconds"] / BUDGET_S[name], 2)
        results[name] = run
        print(f"workbench probe{' --quick' if name == 'quick' else ''}: {run['wall_seconds']:.0f} s wall "
              f"({run['n_pairs']} pairs, {run['layers']} layers; stages {run['stage_seconds']}) = "
              f"{run['ratio_to_budget']:.2f}x the {BUDGET_S[name]:.0f} s budget")
    results["load_average_after"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / ("probe_quick.json" if args.quick else "probe.json")).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
