"""The interference experiment: train SAEs, map interference, intervene at four loci vs baselines, share.

``run_experiment(cfg)`` computes (the ``polysemantic`` study job); ``write_experiment(result, out)`` writes
saes.csv, interference.json, trials.csv (one row per condition x locus x scale x pair x prompt), stats.csv
(interfering, and shared when a partner model gives shared pairs, vs each baseline per locus and scale and
best-over-scales: mean difference, bootstrap 95% CI, Mann-Whitney p, Benjamini-Hochberg q over every
comparison), per ``transfer`` partner transfer-MODEL-{trials,stats}.csv (the prompt-level probes replayed
on the partner) and shared-MODEL-pairs.csv (the unrelated-yet-interfering pairs with the partner's
interference of their matched counterparts), results.json and figure.png."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

METRICS = ("wcos_rel_change", "overlap_delta", "entered_topk", "kl")
BASELINES = ("random", "related", "low_interference")
TESTED = ("interfering", "shared")  # conditions compared with every baseline
SHARED_ROWS = ("rows", "unrelated_rows", "null_values")  # per-pair tables of workbench.sae.shared (CSV, not results.json)


def choose_pairs(inter: dict, records: dict, W, n: int, rng, sources=None) -> dict[str, list[tuple[int, int, float]]]:
    """Source -> target pairs per condition; every pair's target has a token set.

    ``W``: the decoder rows in the interference map's geometry. ``sources``: only these features may be a
    pair's source (the transfer test's features matched in the partner); None, any.
    """
    ok = [f for f, r in records.items() if r["token_set"]]
    okset = set(ok)
    src = okset if sources is None else okset & set(sources)
    clusters = {c: dict(zip(inter["features"], lab, strict=True)) for c, lab in inter["clusters"].items()}
    coarse, fine = clusters[f"{inter['cutoff']:.2f}"], clusters["0.15"]

    def cos(i, j):
        return float(abs(W[i] @ W[j]) / (np.linalg.norm(W[i]) * np.linalg.norm(W[j])))

    interfering, used = [], set()
    for p in inter["unrelated_interfering"]:
        if p["i"] in src and p["j"] in okset and p["i"] not in used:
            interfering.append((p["i"], p["j"], p["interference"]))
            used.add(p["i"])
        if len(interfering) == n:
            break
    related = [(p["i"], p["j"], p["interference"]) for p in inter["pairs"]
               if p["same_cluster_0.15"] and p["i"] in src and p["j"] in okset][:n]
    by_cluster: dict = {}
    for f in ok:
        by_cluster.setdefault(fine[f], []).append(f)
    groups = [g for g in by_cluster.values() if len(g) > 1 and src.intersection(g)]
    tries = 0
    while len(related) < n and groups and tries < 1000:
        tries += 1
        g = groups[rng.integers(len(groups))]
        if sources is None:
            i, j = rng.choice(g, 2, replace=False)
        else:
            i = rng.choice(sorted(src.intersection(g)))
            j = rng.choice([f for f in g if f != i])
        if (int(i), int(j)) not in {(a, b) for a, b, _ in related}:
            related.append((int(i), int(j), cos(i, j)))
    low, tries = [], 0
    pool = ok if sources is None else sorted(src)
    while len(low) < n and tries < 10000 and pool:
        tries += 1
        if sources is None:
            i, j = (int(x) for x in rng.choice(ok, 2, replace=False))
        else:
            i, j = int(rng.choice(pool)), int(rng.choice(ok))
        c = cos(i, j)
        if i != j and c < 0.1 and coarse[i] != coarse[j]:
            low.append((i, j, c))
    random = [(-1, j, float("nan")) for _, j, _ in interfering]  # matched targets, random source
    return {"interfering": interfering, "related": related, "low_interference": low, "random": random}


def run_trials(model, sae, records, pairs, icfg, rng, norm: float, log) -> list[dict]:
    import torch

    from workbench.sae.interventions import (
        LOCI,
        embedding_cosines,
        intervention,
        next_token_metrics,
        next_token_probs,
        token_gradient_direction,
    )

    prompts = icfg["prompts"]
    before = next_token_probs(model, prompts).numpy()
    ecos: dict = {}
    grads: dict = {}
    live = list(records)
    rows = []
    for condition, plist in pairs.items():
        for i, j, interference in plist:
            if j not in ecos:
                ecos[j] = embedding_cosines(model, records[j]["token_set"])
            for locus in LOCI:
                direction = neurons = None
                source = i
                if condition == "random":
                    source = None
                    if locus in ("feature", "token"):
                        direction = torch.nn.functional.normalize(torch.randn(model.cfg.d_model,
                                      generator=torch.Generator().manual_seed(int(rng.integers(1 << 30)))), dim=0)
                    elif locus == "neuron":
                        neurons = rng.choice(model.cfg.d_mlp, 8, replace=False).tolist()
                    else:
                        source = int(rng.choice([f for f in live if f != j]))
                elif locus == "token":
                    if i not in grads:
                        grads[i] = token_gradient_direction(model, sae, i, records[i]["gradient_contexts"])
                    direction = grads[i]
                for scale in icfg["scales"][locus]:
                    s = scale * norm if locus in ("feature", "token") else scale
                    hooks, prefix = intervention(model, sae, locus, source, s, records, direction=direction,
                                                 neurons=neurons)
                    after = next_token_probs(model, [prefix + p for p in prompts], hooks).numpy()
                    for k, p in enumerate(prompts):
                        m = next_token_metrics(before[k], after[k], records[j]["token_set"], ecos[j], k=icfg["topk"])
                        rows.append({"condition": condition, "locus": locus, "scale": scale, "source": i, "target": j,
                                     "interference": interference, "prompt": k, "prompt_text": p,
                                     **{key: float(m[key]) for key in METRICS}})
            log.info("%s %d->%d done (%d rows)", condition, i, j, len(rows))
    return rows


def map_tokens(texts: list[str], tokenizer) -> list[int]:
    """One model's token strings as single tokens of another's vocabulary (strings that split are dropped)."""
    ids = set()
    for text in texts:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) == 1:
            ids.add(int(encoded[0]))
    return sorted(ids)


def transfer_trials(target, records, pairs, icfg, rng, steer: dict | None = None) -> list[dict]:
    """The source model's pairs replayed on ``target``: at the prompt locus, and at the feature locus with ``steer``.

    The prompt locus needs nothing of the source model at run time: prepend feature i's top-activating
    snippet, measure the shift toward feature j's tokens mapped into the target's vocabulary. The feature
    locus (``steer``: the target's analysis ``sae``, the feature ``matches`` source -> target and the
    target site's median token ``norm``) adds the decoder direction of the target feature matched to i
    (a random unit direction for the random baseline) and measures the same shift: if unrelated-yet-
    interfering pairs still beat the baselines, the interference pattern is carried by what the features
    mean, not only by one model's SAE. Pairs whose source feature has no match are left out there.
    """
    import torch

    from workbench.sae.interventions import (
        direction_hook,
        embedding_cosines,
        feature_direction,
        next_token_metrics,
        next_token_probs,
        snippet,
    )

    prompts = icfg["prompts"]
    before = next_token_probs(target, prompts).numpy()
    live = list(records)
    rows = []

    def add(condition, i, j, interference, tokens, cosines, locus, scale, after, **extra):
        for k in range(len(prompts)):
            m = next_token_metrics(before[k], after[k], tokens, cosines, k=icfg["topk"])
            rows.append({"condition": condition, "locus": locus, "scale": scale, "source": i, "target": j,
                         "interference": interference, "prompt": k, "target_tokens": len(tokens),
                         "source_tokens": len(records[j]["token_set"]), **extra,
                         **{key: float(m[key]) for key in METRICS}})

    for condition, plist in pairs.items():
        for i, j, interference in plist:
            tokens = map_tokens(records[j]["token_set_text"], target.tokenizer)
            if not tokens:
                continue
            cosines = embedding_cosines(target, tokens)
            source = i if condition != "random" else int(rng.choice([f for f in live if f != j]))
            after = next_token_probs(target, [snippet(records[source]) + "\n" + p for p in prompts]).numpy()
            add(condition, i, j, interference, tokens, cosines, "prompt", 1.0, after)
            if steer is None:
                continue
            if condition == "random":
                seed = int(rng.integers(1 << 30))
                direction = torch.randn(target.cfg.d_model, generator=torch.Generator().manual_seed(seed))
                matched = -1
            elif i in steer["matches"]:
                matched = steer["matches"][i][0]
                direction = feature_direction(steer["sae"], matched)
            else:
                continue
            site = steer["sae"].cfg.metadata.hook_name
            for scale in icfg["scales"]["feature"]:
                hooks = [(site, direction_hook(direction, scale * steer["norm"]))]
                after = next_token_probs(target, prompts, hooks).numpy()
                add(condition, i, j, interference, tokens, cosines, "feature", scale, after, target_feature=matched)
    return rows


def compare(rows: list[dict], n_boot: int, rng) -> list[dict]:
    """Each tested condition (interfering; shared when present) vs each baseline, per locus x (each scale,
    best-over-scales) x metric; Benjamini-Hochberg across all comparisons."""
    from scipy.stats import false_discovery_control, mannwhitneyu

    def values(cond, locus, scale, metric):
        sel = [r for r in rows if r["condition"] == cond and r["locus"] == locus]
        if scale != "best":
            return np.array([r[metric] for r in sel if r["scale"] == scale], dtype=float)
        best: dict = {}
        for r in sel:  # per (pair, prompt), the best scale: what best-over-scales reporting does
            key = (r["source"], r["target"], r["prompt"])
            best[key] = max(best.get(key, -np.inf), r[metric])
        return np.array(list(best.values()), dtype=float)

    out = []
    tested = [c for c in TESTED if any(r["condition"] == c for r in rows)]
    for condition in tested:
        for locus in sorted({r["locus"] for r in rows}):
            scales = sorted({r["scale"] for r in rows if r["locus"] == locus}) + ["best"]
            for scale in scales:
                for metric in METRICS:
                    a = values(condition, locus, scale, metric)
                    for base in BASELINES:
                        b = values(base, locus, scale, metric)
                        if len(a) < 2 or len(b) < 2:
                            continue
                        diffs = [rng.choice(a, len(a)).mean() - rng.choice(b, len(b)).mean() for _ in range(n_boot)]
                        lo, hi = np.percentile(diffs, [2.5, 97.5])
                        p = mannwhitneyu(a, b, alternative="two-sided").pvalue if np.ptp(np.r_[a, b]) > 0 else 1.0
                        out.append({"condition": condition, "locus": locus, "scale": scale, "metric": metric,
                                    "baseline": base, "condition_mean": a.mean(), "baseline_mean": b.mean(),
                                    "diff": a.mean() - b.mean(), "ci_low": lo, "ci_high": hi, "p": float(p),
                                    "n_condition": len(a), "n_baseline": len(b)})
    if out:
        q = false_discovery_control([r["p"] for r in out], method="bh")
        for r, qq in zip(out, q, strict=True):
            r["q_bh"] = float(qq)
    return out


def figure(path: Path, stats: list[dict], inter: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    axes[0].bar(inter["bins"], inter["base_rates"])
    axes[0].set_yscale("log")
    axes[0].set_title("interference base rates (all decoder pairs)")
    sel = [s for s in stats if s["metric"] == "wcos_rel_change" and s["scale"] != "best"
           and s["condition"] == "interfering"]
    labels = [f"{s['locus']}\n{s['scale']:g} vs {s['baseline'][:4]}" for s in sel]
    x = np.arange(len(sel))
    axes[1].errorbar(x, [s["diff"] for s in sel], yerr=[[s["diff"] - s["ci_low"] for s in sel],
                                                        [s["ci_high"] - s["diff"] for s in sel]], fmt="o")
    axes[1].axhline(0, color="grey", lw=0.5)
    axes[1].set_xticks(x, labels, rotation=90, fontsize=5)
    axes[1].set_title("weighted-cosine change: interfering minus baseline (95% CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def model_config(cfg: dict, name: str) -> dict:
    """The study config as seen by one model: its entry under ``models`` (sites, SAEs, ...) laid over the rest."""
    per = (cfg.get("models") or {}).get(name) or {}
    merged = {**cfg, **{k: v for k, v in per.items() if k != "collect"}, "model": name}
    merged["collect"] = {**cfg.get("collect", {}), **per.get("collect", {})}
    return merged


def sae_name(cfg: dict, n: int) -> str:
    """Readable, and keyed by everything that shapes the SAE, so a quick run never meets a full run's SAE."""
    import hashlib

    spec = cfg["saes"][n]
    key = json.dumps([spec, cfg["collect"], cfg["train_tokens"], cfg["seed"], cfg.get("source")], sort_keys=True,
                     default=str)
    return (f"study-{cfg['model']}-{n}-{spec['site'].split('.')[1]}-{spec['architecture']}-{spec.get('d_sae')}-"
            f"{hashlib.sha256(key.encode()).hexdigest()[:8]}")


def prepare_model(cfg: dict, model, only_analysis: bool = False) -> dict:
    """One model's SAEs (trained or resumed by name), and its analysis SAE's descriptions and interference map.

    Descriptions and the interference map are reused when they are newer than the SAE and were made
    with the same settings; ``only_analysis`` trains just the analysis SAE (what a partner model needs).
    """
    from workbench.commands.sae import (
        EMBEDDINGS_FILE,
        FEATURES_FILE,
        INTERFERENCE_FILE,
        default_store_path,
        run_features,
        run_interference,
        run_train,
    )
    from workbench.sae.features import records_by_feature
    from workbench.sae.interference import decoder_geometry
    from workbench.sae.load import load_sae
    from workbench.store import ActivationStore

    c = cfg["collect"]
    store_path = default_store_path(model, c["sites"], c["n_tokens"], c["block_len"], cfg["seed"], cfg.get("source"))
    sae_rows = []
    for n, spec in enumerate(cfg["saes"]):
        if only_analysis and n != cfg["analysis_sae"]:
            continue
        spec = dict(spec)
        res = run_train(model, spec.pop("site"), architecture=spec.pop("architecture"), n_tokens=c["n_tokens"],
                        train_tokens=spec.pop("train_tokens", cfg["train_tokens"]), block_len=c["block_len"],
                        activations=str(store_path), collect_sites=c["sites"],
                        collect_budget_s=c["budget_s"] if not sae_rows else 0, eval_tokens=cfg["eval_tokens"],
                        seed=cfg["seed"], source=cfg.get("source"), progress=False, name=sae_name(cfg, n), **spec)
        sae_rows.append({"name": res["name"], "site": res["metrics"]["site"], "model": cfg["model"],
                         "architecture": cfg["saes"][n]["architecture"], "d_sae": cfg["saes"][n].get("d_sae"),
                         "tokens_collected": res["tokens_collected"], "tokens_trained": res["tokens_trained"],
                         "epochs": round(res["epochs"], 2),
                         **{k: res["metrics"][k] for k in ("l0", "explained_variance", "dead_fraction", "ce_clean",
                                                           "ce_spliced", "ce_zero_ablation", "ce_recovered")},
                         "path": res["path"]})
        log.info("SAE %s: %s", res["name"], res["metrics"])
    main = next(r for r in sae_rows if r["name"] == sae_name(cfg, cfg["analysis_sae"]))
    folder = Path(main["path"])
    weights = folder / "sae_weights.safetensors"
    ic = cfg["interference"]

    def fresh(name: str) -> bool:
        f = folder / name
        return f.exists() and (not weights.exists() or f.stat().st_mtime > weights.stat().st_mtime)

    if fresh(FEATURES_FILE) and fresh(EMBEDDINGS_FILE):
        feats = {"path": str(folder), "reused": True}
    else:
        feats = run_features(str(folder), model, progress=False)
    geometry = ic.get("geometry", "raw")
    inter = json.loads((folder / INTERFERENCE_FILE).read_text()) if fresh(INTERFERENCE_FILE) else {}
    settings = [inter.get(k) for k in ("k", "min_interference", "cutoff")] + [inter.get("geometry", "raw")]
    if settings != [ic["k"], ic["min_interference"], ic["cutoff"], geometry] \
            or not fresh(INTERFERENCE_FILE) or (folder / INTERFERENCE_FILE).stat().st_mtime < (folder / FEATURES_FILE).stat().st_mtime:
        run_interference(str(folder), model, k=ic["k"], min_interference=ic["min_interference"], cutoff=ic["cutoff"],
                         geometry=geometry)
        inter = json.loads((folder / INTERFERENCE_FILE).read_text())
    records = records_by_feature(json.loads((folder / FEATURES_FILE).read_text()))
    sae = load_sae(str(folder), model=model)
    W = decoder_geometry(sae, geometry, ActivationStore(store_path)).numpy()  # the map's geometry, for pair cosines
    return {"saes": sae_rows, "main": main, "features": feats, "interference": inter, "records": records,
            "embeddings": np.load(folder / EMBEDDINGS_FILE), "sae": sae, "W": W, "store_path": store_path}


def median_norm(store, site: str) -> float:
    """The median token norm at ``site``, shard by shard (a 2M-token store never exists as one float tensor)."""
    import torch

    norms = [store.read_shard(i, [site]).tensors[site].float().norm(dim=1) for i in range(len(store.manifest["shards"]))]
    return float(torch.cat(norms).median())


def shared_pairs(shared: dict, records: dict, n: int) -> list[tuple[int, int, float]]:
    """The first ``n`` shared pairs whose target has a token set, one per source feature."""
    out, used = [], set()
    for r in shared["shared"]:
        if records.get(r["i"], {}).get("token_set") and records.get(r["j"], {}).get("token_set") \
                and r["i"] not in used:
            out.append((r["i"], r["j"], r["interference"]))
            used.add(r["i"])
        if len(out) == n:
            break
    return out


def shared_figure(path: Path, shared: dict, source: str, partner: str) -> None:
    """A's interference vs the partner's for matched pairs, and the partner's interference: A's pairs vs the null."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows, unrel = shared["rows"], shared["unrelated_rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].scatter([r["interference"] for r in rows], [r["interference_b"] for r in rows], s=3, alpha=0.3,
                    label="top-k partner pairs")
    axes[0].scatter([r["interference"] for r in unrel], [r["interference_b"] for r in unrel], s=8, color="C3",
                    label="unrelated yet interfering")
    axes[0].axhline(shared["min_interference_b"], color="grey", lw=0.5)
    rho = shared["table_spearman"]
    axes[0].set_xlabel(f"{source} |cos|")
    axes[0].set_ylabel(f"{partner} |cos| of the matched features")
    axes[0].set_title(f"matched pairs (Spearman {rho['rho']:.2f}, n={rho['n']})")
    axes[0].legend(fontsize=7)
    bins = np.linspace(0, 1, 41)
    axes[1].hist(shared["null_values"], bins=bins, density=True, alpha=0.5, label="random matched pairs")
    axes[1].hist([r["interference_b"] for r in unrel], bins=bins, density=True, alpha=0.5, color="C3",
                 label=f"{source}'s unrelated yet interfering")
    axes[1].set_yscale("log")
    axes[1].set_xlabel(f"{partner} |cos|")
    axes[1].legend(fontsize=7)
    axes[1].set_title(f"{shared['n_matched']} features matched, {len(shared['shared'])} shared pairs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_experiment(cfg: dict) -> dict:
    """Everything the study reports, from one config (``model``, ``seed``, ``collect``, ``saes``, ...).

    With ``transfer`` partners: each partner's analysis SAE is trained (or reused by name), features are
    matched across the models (``workbench.sae.shared``), pairs that interfere in both become the
    ``shared`` condition, tested at the four loci here and through prompt probes on the partner.
    """
    import torch

    from workbench.models import load_model
    from workbench.report import versions
    from workbench.sae.shared import match_features, shared_interference
    from workbench.store import ActivationStore

    top, cfg = cfg, model_config(cfg, cfg["model"])  # a partner's view is laid over the top level, not this one
    torch.manual_seed(cfg["seed"])
    rng = np.random.default_rng(cfg["seed"])
    model = load_model(cfg["model"], device="cpu")
    started = time.time()
    own = prepare_model(cfg, model)
    sae, records, inter, icfg = own["sae"], own["records"], own["interference"], cfg["interventions"]
    pairs = choose_pairs(inter, records, own["W"], icfg["n_pairs"], rng)
    sc = cfg.get("shared", {})
    partners = {}
    for name in cfg.get("transfer", []):
        pcfg = model_config(top, name)
        target = load_model(name, device="cpu")
        other = prepare_model(pcfg, target, only_analysis=True)
        matches = match_features(own["embeddings"], inter["features"], other["embeddings"],
                                 other["interference"]["features"], sc.get("min_similarity", 0.6))
        result = shared_interference(inter, own["W"], other["W"], matches, sc.get("min_interference_b", 0.2),
                                     seed=cfg["seed"])
        result["pairs"] = shared_pairs(result, records, icfg["n_pairs"])
        result["partner_sae"] = {k: v for k, v in other["main"].items() if k != "path"}
        steer = {"sae": other["sae"], "matches": matches,
                 "norm": median_norm(ActivationStore(other["store_path"]), other["main"]["site"])}
        log.info("shared with %s: %d matched features, %d shared pairs", name, result["n_matched"],
                 len(result["shared"]))
        partners[name] = (target, result, steer)
    for _, result, _ in partners.values():
        pairs.setdefault("shared", [])
        pairs["shared"] += [p for p in result["pairs"] if p not in pairs["shared"]]
    if not pairs.get("shared"):
        pairs.pop("shared", None)
    norm = median_norm(ActivationStore(own["store_path"]), own["main"]["site"])
    rows = run_trials(model, sae, records, pairs, icfg, rng, norm, log)
    stats = compare(rows, icfg["n_bootstrap"], rng)
    unrelated = inter["unrelated_interfering"][:20]
    for p in unrelated:
        p["i_description"] = records[p["i"]]["description"][:160]
        p["j_description"] = records[p["j"]]["description"][:160]
    summary = {k: inter[k] for k in ("bins", "bin_counts", "base_rates", "n_pairs", "n_described",
                                     "n_unrelated_interfering", "min_interference", "cutoff")}
    summary["n_clusters"] = {k: int(len(set(v))) for k, v in inter["clusters"].items()}
    summary["top_unrelated_interfering"] = unrelated
    transfer = {}
    for name, (target, result, steer) in partners.items():
        # the same pairs at both loci: sources matched in the partner, so the feature locus can steer each one
        own_pairs = choose_pairs(inter, records, own["W"], icfg["n_pairs"], rng, sources=steer["matches"])
        own_pairs["shared"] = result["pairs"]
        trials = transfer_trials(target, records, own_pairs, icfg, rng, steer)
        transfer[name] = {"trials": trials, "stats": compare(trials, icfg["n_bootstrap"], rng), "shared": result}
        log.info("transfer to %s: %d trials", name, len(trials))
    del partners
    return {"config": cfg, "versions": versions(), "seconds": round(time.time() - started, 1),
            "residual_median_norm": norm, "saes": own["saes"], "features": own["features"], "interference": summary,
            "pairs": {k: [list(p) for p in v] for k, v in pairs.items()}, "trials": rows, "stats": stats,
            "transfer": transfer}


def write_experiment(result: dict, out: str | Path) -> Path:
    """The study's files in ``out`` (see the module docstring)."""
    from workbench.io import write_csv_atomic, write_json_atomic

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(out / "saes.csv", [{k: v for k, v in r.items() if k != "path"} for r in result["saes"]])
    write_csv_atomic(out / "trials.csv", result["trials"])
    write_csv_atomic(out / "stats.csv", result["stats"])
    write_json_atomic(out / "interference.json", result["interference"])
    for name, t in result.get("transfer", {}).items():
        write_csv_atomic(out / f"transfer-{name}-trials.csv", t["trials"])
        write_csv_atomic(out / f"transfer-{name}-stats.csv", t["stats"])
        if "shared" in t:
            write_csv_atomic(out / f"shared-{name}-pairs.csv", t["shared"]["unrelated_rows"])
            shared_figure(out / f"shared-{name}.png", t["shared"], result["config"]["model"], name)
    write_json_atomic(out / "results.json", {
        **{k: v for k, v in result.items() if k not in ("trials", "transfer")},
        "transfer": {name: {"stats": t["stats"], "n_trials": len(t["trials"]),
                            "shared": {k: v for k, v in t.get("shared", {}).items() if k not in SHARED_ROWS}}
                     for name, t in result.get("transfer", {}).items()}})
    figure(out / "figure.png", result["stats"], result["interference"])
    return out
