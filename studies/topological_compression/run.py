"""Regenerate the topological-compression study: the grid through the study runner, then figures.

    python studies/topological_compression/run.py [--config config.yaml] [--engine local|ray]

Jobs and their probe folders (with interactive report.html files) are cached in the user cache, so
a re-run only computes what is missing. Writes results.csv, results.json and signature_by_layer.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HERE = Path(__file__).parent
SIGNATURE = ["h0_death_mean", "h1_count", "h1_persistence_mean", "h1_entropy"]


def figure(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 3.6 * len(models)), squeeze=False)
    for m, name in enumerate(models):
        mine = sorted((r for r in rows if r["model"] == name and r["condition"] == "injection"), key=lambda r: r["layer"])
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
    from workbench.study import results_table, run_study, write_results

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=HERE / "config.yaml")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--engine", default="local", choices=["local", "ray"])
    args = parser.parse_args()
    outcome = run_study(args.config, engine=args.engine)
    write_results(outcome, args.out)
    rows = results_table(outcome)
    if rows:
        figure(rows, args.out)
    for failed in outcome["failed"]:
        print(f"failed: {failed['params']}: {failed['error']}")


if __name__ == "__main__":
    main()
