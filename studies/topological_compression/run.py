"""Regenerate the topological-compression study: tables (CSV/JSON) and figures (PNG + HTML).

    python studies/topological_compression/run.py --config studies/topological_compression/config.yaml

Runs ``workbench.probe.run_probe`` per model and condition (resumable: probe folders live in the
user cache), then collects every layer's signature features into one table and writes the verdict
numbers the README quotes. Same config and seed give the same numbers.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import yaml

HERE = Path(__file__).parent
SIGNATURE = ["h0_death_mean", "h1_count", "h1_persistence_mean", "h1_entropy"]


def layers_of(spec, n_layers: int):
    if spec in (None, "all"):
        return list(range(n_layers))
    if isinstance(spec, str) and spec.startswith("every-"):
        step = int(spec.split("-")[1])
        return sorted(set(range(0, n_layers, step)) | {n_layers - 1})
    return [int(x) for x in spec]


def run(config_path: Path, out: Path, quick: bool = False) -> list[dict]:
    from workbench.models import load_model
    from workbench.paths import cache_dir
    from workbench.probe import ProbeConfig, run_probe
    from workbench.report import versions
    from workbench.store import write_json_atomic

    config = yaml.safe_load(config_path.read_text())
    out.mkdir(parents=True, exist_ok=True)
    rows, reports = [], {}
    for name in config["models"]:
        model = load_model(name, device="cpu")
        layers = layers_of(config["layers"], model.cfg.n_layers)
        settings = dict(config["probe"], flow_gaps=tuple(config["probe"]["flow_gaps"]))
        probe_config = ProbeConfig(model=name, conditions=tuple(config["conditions"]), layers=layers,
                                   seed=config["seed"], **settings)
        if quick:
            probe_config = ProbeConfig.quick(model=name, conditions=probe_config.conditions, seed=config["seed"],
                                             layers=layers[:: max(1, len(layers) // 4)])
        work = cache_dir("studies", "topological_compression", f"{name}{'-quick' if quick else ''}")
        report = run_probe(model, probe_config, work)
        reports[name] = report
        print(f"{name}: interactive report in {work / 'report.html'}")
        for condition, result in report["conditions"].items():
            for layer, r in result["layers"].items():
                row = {"model": name, "condition": condition, "layer": int(layer), "k": r["k"],
                       "auc_ph": r["auc_topology"], "auc_probe_rows": r["auc_probe_rows"],
                       "auc_probe_means": r["auc_probe_means"], "n_moved": len(r["moved"])}
                for feature in SIGNATURE:
                    i = r["features"].index(feature)
                    row |= {f"{feature}_clean": r["mean_clean"][i], f"{feature}_attack": r["mean_adversarial"][i],
                            f"{feature}_g": r["g"][i], f"{feature}_g_low": r["g_low"][i],
                            f"{feature}_g_high": r["g_high"][i], f"{feature}_q": r["q_perm"][i],
                            f"{feature}_verdict": r["signature"][feature]}
                rows.append(row)
        del model
    with open(out / "results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = {name: {c: res["summary"] for c, res in rep["conditions"].items()} for name, rep in reports.items()}
    flow = {name: {c: {g: {k: {kk: vv for kk, vv in e[k].items() if not kk.endswith("curve")}
                            for k in ("flow", "control")} for g, e in res.get("neuron_flow", {}).get("gaps", {}).items()}
                   for c, res in rep["conditions"].items()} for name, rep in reports.items()}
    write_json_atomic(out / "results.json", {"config": config, "versions": versions(), "summary": summary,
                                             "neuron_flow": flow, "rows": rows})
    figures(rows, reports, out)
    return rows


def figures(rows: list[dict], reports: dict, out: Path) -> None:
    """PNG figures for the repository; the full interactive reports stay beside each probe run (user cache)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 3.6 * len(models)), squeeze=False)
    for m, name in enumerate(models):
        mine = [r for r in rows if r["model"] == name and r["condition"] == "injection"]
        layers = [r["layer"] for r in mine]
        ax = axes[m, 0]
        ax.plot(layers, [r["auc_ph"] for r in mine], "o-", label="PH summary + LR")
        ax.plot(layers, [r["auc_probe_rows"] for r in mine], "s--", label="linear probe (per prompt)")
        ax.plot(layers, [r["auc_probe_means"] for r in mine], "^:", label="linear probe (subsample means)")
        ax.set_ylim(0.4, 1.02)
        ax.set_title(f"{name}: clean vs injected, cross-validated AUC")
        ax.set_xlabel("layer")
        ax.legend(fontsize=8)
        ax = axes[m, 1]
        for feature in SIGNATURE:
            g = [r[f"{feature}_g"] for r in mine]
            err = [[r[f"{feature}_g"] - r[f"{feature}_g_low"] for r in mine],
                   [r[f"{feature}_g_high"] - r[f"{feature}_g"] for r in mine]]
            ax.errorbar(layers, g, yerr=err, marker="o", capsize=2, label=feature)
        ax.axhline(0, color="grey", lw=0.8, ls=":")
        ax.set_title(f"{name}: effect of injection (Hedges g, 95% CI)")
        ax.set_xlabel("layer")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "signature_by_layer.png", dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=HERE / "config.yaml")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--quick", action="store_true", help="a small smoke run (not the committed results)")
    args = parser.parse_args()
    rows = run(args.config, args.out, args.quick)
    print(json.dumps({"rows": len(rows), "out": str(args.out)}))


if __name__ == "__main__":
    main()
