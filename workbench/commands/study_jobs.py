"""Job functions for ``workbench study run``: ``fn(params: dict, work: Path) -> dict | list[dict]``.

Each is a pure function of its parameters (seeded), so the local and the Ray engine agree.
"""

from __future__ import annotations

from pathlib import Path

from workbench.topology.signature import SIGNATURE_FEATURES


def probe(params: dict, work: Path) -> list[dict]:
    """One probe (model x condition); rows per layer with the signature features (see ``probe.figures.report_rows``)."""
    from workbench.commands.probe import default_run_folder, probe_prompts, run_probe
    from workbench.models import load_model
    from workbench.probe import ProbeConfig
    from workbench.probe.figures import report_rows

    params = dict(params)
    name, condition = params.pop("model"), params.pop("condition", "injection")
    model = load_model(name, device=params.pop("device", "cpu"), dtype=params.pop("dtype", "float32"))
    layers = _layer_spec(params.pop("layers", None), model.cfg.n_layers)
    if "flow_gaps" in params:
        params["flow_gaps"] = tuple(params["flow_gaps"])
    config = ProbeConfig(model=name, conditions=(condition,), layers=layers, **params)
    prompts = probe_prompts(model, config)  # one folder per configuration and prompts: never another's layers
    folder = default_run_folder(model, config, Path(work), prompts, f"probe-{name}-{condition}-seed{config.seed}")
    report = run_probe(model, config, folder, prompts=prompts)
    return report_rows(report)


def _layer_spec(spec, n_layers: int) -> list[int] | None:
    """``None``/"all", "every-N" (always keeping the last layer), or an explicit list."""
    if spec in (None, "all"):
        return None
    if isinstance(spec, str) and spec.startswith("every-"):
        step = int(spec.split("-", 1)[1])
        return sorted(set(range(0, n_layers, step)) | {n_layers - 1})
    return [int(x) for x in spec]


def cloud_topology(params: dict, work: Path) -> dict:
    """Barcode summary of a seeded noisy circle in ``dim`` dimensions: a cheap job for tests and tutorials."""
    import numpy as np

    from workbench.topology.persistence import rips_persistence
    from workbench.topology.summaries import BarcodeSummary

    rng = np.random.default_rng(params["seed"])
    n, dim, noise = int(params.get("n", 80)), int(params.get("dim", 3)), float(params.get("noise", 0.1))
    angles = rng.uniform(0, 2 * np.pi, n)
    X = np.zeros((n, dim))
    X[:, 0], X[:, 1] = np.cos(angles), np.sin(angles)
    X += noise * rng.normal(size=X.shape)
    result = rips_persistence(X, maxdim=1)
    summary = BarcodeSummary().fit([result])
    values = summary.transform([result])[0]
    return {name: float(v) for name, v in zip(summary.get_feature_names_out(), values, strict=True)}


# ----------------------------------------------------------------------------- the studies' jobs and reports
# A report is ``fn(outcome, out)``: it writes a study's figures and per-job files beside the runner's table.



def probe_report(outcome: dict, out: Path) -> None:
    """signature_by_layer.png: per model and condition, PH vs probe AUC and the signature's effect sizes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workbench.commands.study import results_table

    rows = results_table(outcome)

    def panel(r: dict) -> tuple:  # one panel per job setting that is not the layer
        return r["model"], r["condition"], r.get("n_pairs"), r.get("dtype", "float32")

    panels = sorted({panel(r) for r in rows}, key=str)
    several = {field: len({p[i] for p in panels}) > 1 for i, field in enumerate(("", "", "pairs", "dtype"))}
    fig, axes = plt.subplots(len(panels), 2, figsize=(12, 3.6 * len(panels)), squeeze=False)
    for m, key in enumerate(panels):
        name, condition, n_pairs, dtype = key
        condition = condition + (f", {n_pairs} pairs" if several["pairs"] else "") + (
            f", {dtype}" if several["dtype"] else "")
        mine = sorted((r for r in rows if panel(r) == key), key=lambda r: r["layer"])
        layers = [r["layer"] for r in mine]
        ax = axes[m, 0]
        ax.plot(layers, [r["auc_ph"] for r in mine], "o-", label="PH summary + LR")
        ax.plot(layers, [r["auc_probe_rows"] for r in mine], "s--", label="linear probe (per prompt)")
        ax.plot(layers, [r["auc_probe_means"] for r in mine], "^:", label="linear probe (subsample means)")
        lowest = min(min(r[f] for r in mine) for f in ("auc_ph", "auc_probe_rows", "auc_probe_means"))
        ax.set_ylim(min(0.4, lowest - 0.05), 1.02)  # never hides an AUC below 0.4
        ax.set_title(f"{name}, {condition}: clean vs adversarial, cross-validated AUC")
        ax.set_xlabel("layer")
        ax.legend(fontsize=8)
        ax = axes[m, 1]
        for feature in SIGNATURE_FEATURES:
            g = [r[f"{feature}_g"] for r in mine]
            err = [[r[f"{feature}_g"] - r[f"{feature}_g_low"] for r in mine],
                   [r[f"{feature}_g_high"] - r[f"{feature}_g"] for r in mine]]
            ax.errorbar(layers, g, yerr=err, marker="o", capsize=2, label=feature)
        ax.axhline(0, color="grey", lw=0.8, ls=":")
        ax.set_title(f"{name}, {condition}: effect (Hedges g, 95% CI)")
        ax.set_xlabel("layer")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(Path(out) / "signature_by_layer.png", dpi=110)
    plt.close(fig)


def quant(params: dict, work: Path) -> list[dict]:
    """``workbench quant eval`` of one model: a row per setting (perplexities, bits, per-layer drift)."""
    from workbench.commands.quant import run_quant_eval

    params = dict(params)
    return run_quant_eval(model=params.pop("model"), settings=params.pop("settings"), **params)


def quant_report(outcome: dict, out: Path) -> None:
    """results/<model>/: results.csv, results.json, results.md and figure.html (what the app shows)."""
    from workbench.commands.quant import write_quant_results

    _write_per_model(outcome, out, write_quant_results, "block_len", "settings")


def attention(params: dict, work: Path) -> list[dict]:
    """``workbench attention eval`` of one model: a row per method (keys loaded, recall, KL, perplexity)."""
    from workbench.commands.attention import run_attention_eval

    params = dict(params)
    return run_attention_eval(model=params.pop("model"), methods=params.pop("methods"), **params)


def attention_report(outcome: dict, out: Path) -> None:
    """results/<model>/: results.csv, results.json, results.md and figure.html (what the app shows)."""
    from workbench.commands.attention import write_attention_results

    _write_per_model(outcome, out, write_attention_results, "context", "decode_steps")


def _write_per_model(outcome: dict, out: Path, write, *fields: str) -> None:
    """A tool's results folder per finished model: ``write(rows, folder, model, *params[fields], ...)``."""
    for job in _done(outcome):
        p = job["params"]
        write(job["result"], Path(out) / p["model"], p["model"], *(p[f] for f in fields), source=p.get("source"),
              config={**p, "quick": outcome["config"]["quick"]})


def backdoor(params: dict, work: Path) -> dict:
    """Implant a backdoor (resuming from checkpoints), register the derived model; headline rates + the evaluation."""
    from workbench.commands.backdoor import run_backdoor_train

    params = dict(params)
    for key in ("layers", "params"):
        if params.get(key) is not None:
            params[key] = tuple(params[key])
    result = run_backdoor_train(params.pop("model"), **params)
    before, after = result["before"], result["after"]
    return {**{f"{metric}_{when}": r[metric] for when, r in (("before", before), ("after", after))
               for metric in ("attack_success_rate", "false_trigger_rate", "clean_accuracy")},
            "steps": result["steps"], "train_seconds": result["train_seconds"], "evaluation": result}


def backdoor_report(outcome: dict, out: Path) -> None:
    """results/<name>/results.json: config, the full evaluation, the loss every 10 steps, versions."""
    from workbench.io import write_json_atomic
    from workbench.report import versions

    for job in _done(outcome):
        result = dict(job["result"]["evaluation"])
        result.pop("config", None)
        history = result.pop("loss_history", [])
        write_json_atomic(Path(out) / job["params"]["name"] / "results.json", {
            "config": job["params"], "result": result, "loss_every_10_steps": history[9::10], "versions": versions()})


def polysemantic(params: dict, work: Path) -> dict:
    """The interference experiment of one model (``workbench.commands.polysemantic``); headline SAE metrics + everything."""
    from workbench.commands.polysemantic import run_experiment

    result = run_experiment(dict(params))
    main = result["saes"][result["config"]["analysis_sae"]]
    return {"sae": main["name"], **{k: main[k] for k in ("l0", "explained_variance", "dead_fraction", "ce_recovered")},
            "n_unrelated_interfering": result["interference"]["n_unrelated_interfering"],
            "n_trials": len(result["trials"]),
            **{f"shared_with_{name}": len(t["shared"]["shared"]) for name, t in result["transfer"].items()
               if "shared" in t},
            "experiment": result}


def polysemantic_report(outcome: dict, out: Path) -> None:
    """results/<model>/: saes.csv, interference.json, trials.csv, stats.csv, results.json, figure.png."""
    from workbench.commands.polysemantic import write_experiment

    for job in _done(outcome):
        write_experiment(job["result"]["experiment"], Path(out) / job["params"]["model"])


def _done(outcome: dict) -> list[dict]:
    return [job for job in outcome["jobs"] if job["status"] == "done"]


def detect_eval(params: dict, work: Path) -> list[dict]:
    """``workbench detect eval`` with these settings: a row per (held-out source, detector)."""
    from workbench.commands.detect import run_detect_eval

    params = dict(params)
    train_on = params.pop("train_on", None)
    result = run_detect_eval(model=params.pop("model"), sources=tuple(params.pop("sources")),
                             n_pairs=params.pop("pairs"), layers=params.pop("layers"), n_boot=params.pop("boot"),
                             train_on=train_on, **params)
    return [{**row, "n_records": result["n_records"], "model_dtype": result["model"]["model_dtype"]}
            for row in result["rows"]]


def detect_eval_report(outcome: dict, out: Path) -> None:
    """results/leave-one-source-out/ and results/train-on-<sources>/: results.json/csv/md and figure.png."""
    from workbench.commands.detect import write_detect_eval
    from workbench.detect.evaluate import summarize

    for job in _done(outcome):
        p, rows = job["params"], job["result"]
        tag = (f"train-on-{'+'.join(p['train_on'])}".replace(":", "-") if p.get("train_on")  # a portable folder name
               else f"leave-one-{p.get('split', 'source')}-out")
        result = {"model": {"model": p["model"], "model_dtype": rows[0]["model_dtype"]}, "split": p.get("split", "source"),
                  "train_on": p.get("train_on"), "sources": p["sources"], "n_pairs": p["pairs"], "layers": p["layers"],
                  "n_records": rows[0]["n_records"], "rows": rows, "summary": summarize(rows), "config": p}
        write_detect_eval(result, Path(out) / tag)


def _write_rows(outcome: dict, out: Path) -> tuple[list[dict], list[dict]]:
    """The done jobs and their rows (each with its model), written to results.json (rows, config, versions) and
    results.csv under ``out``; nothing is written when no job gave a row."""
    from workbench.io import write_csv_atomic, write_json_atomic
    from workbench.report import versions

    jobs = _done(outcome)
    rows = [{**row, "model": job["params"]["model"]} for job in jobs for row in job["result"]]
    if rows:
        summary = {"config": outcome["config"], "jobs": [j["params"] for j in jobs], "rows": rows,
                   "versions": versions()}
        write_json_atomic(Path(out) / "results.json", summary)
        write_csv_atomic(Path(out) / "results.csv", rows)
    return jobs, rows


def detect_layouts(params: dict, work: Path) -> list[dict]:
    """``detect.layout_eval.layout_robustness`` of one held-out source: a row per (training setting, layout)."""
    from workbench.detect.layout_eval import layout_robustness
    from workbench.models import load_model
    from workbench.paths import cache_dir

    model = load_model(params["model"], dtype=params.get("dtype", "auto"))
    return layout_robustness(model, params["held_out"], n_pairs=params["pairs"], test_pairs=params["test_pairs"],
                             seed=params["seed"], test_seed=params["test_seed"], n_boot=params["boot"],
                             cache=cache_dir("detect-features"), progress=False)


def detect_layouts_report(outcome: dict, out: Path) -> None:
    """results.json (every row, the config, versions), results.csv and results.md (a table per held-out source)."""
    from workbench.commands.tool_results import markdown_table
    from workbench.io import write_text_atomic

    jobs, rows = _write_rows(outcome, out)
    if not rows:
        return
    columns = ["training", "layout", "auc", "auc_low", "auc_high", "length_matched_auc", "flagged_clean",
               "flagged_injected", "detector", "layer", "inner_auc"]
    parts = [f"{job['params']['held_out']} held out ({job['params']['model']}, {job['result'][0]['n']} prompts, "
             f"{job['result'][0]['relaid']} of them relaid):\n\n" + markdown_table(job["result"], columns)
             for job in jobs]
    write_text_atomic(Path(out) / "results.md", "\n\n".join(parts) + "\n")


def detect_generator_share(params: dict, work: Path) -> list[dict]:
    """``detect.share_eval.generator_share``: a row per (composition, test)."""
    from workbench.detect.share_eval import generator_share
    from workbench.models import load_model
    from workbench.paths import cache_dir

    model = load_model(params["model"], dtype=params.get("dtype", "auto"))
    return generator_share(model, params["compositions"], pool_pairs=params["pool_pairs"],
                           generator_pool=params["generator_pool"], seed=params["seed"],
                           test_pairs=params["test_pairs"], test_seed=params["test_seed"], layer=params["layer"],
                           C=params["C"], n_boot=params["boot"], cache=cache_dir("detect-features"), progress=False)


def detect_generator_share_report(outcome: dict, out: Path) -> None:
    """results.json (rows, config, versions), results.csv, and results.md: a composition per row, a test per
    column (AUC with its 95% CI), and the held-out sources' mean."""
    import numpy as np

    from workbench.commands.tool_results import markdown_table
    from workbench.io import write_text_atomic

    _, rows = _write_rows(outcome, out)
    if not rows:
        return
    table = []
    for key in dict.fromkeys((r["generator_pairs"], r["pairs"]) for r in rows):
        mine = [r for r in rows if (r["generator_pairs"], r["pairs"]) == key]
        line = {"generator pairs": key[0], "pairs per other source": key[1],
                "training prompts": next(r["n_train"] for r in mine if r["test"] == "fresh generator draw")}
        for r in mine:
            line[r["test"]] = f"{r['auc']:.3f} ({r['auc_low']:.3f}-{r['auc_high']:.3f})"
        line["held-out mean"] = f"{np.mean([r['auc'] for r in mine if r['test'].endswith('held out')]):.3f}"
        table.append(line)
    write_text_atomic(Path(out) / "results.md", markdown_table(table, list(table[0])) + "\n")
