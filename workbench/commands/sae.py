"""``workbench sae train|features|interference|intervene``: plain functions returning dicts.

The CLI (and the app, and the study) call these; they load what they need, write results next to
the SAE in the user cache, and never print.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from workbench.errors import WorkbenchError, require
from workbench.sae.train import EMBEDDINGS_FILE, FEATURES_FILE, INTERFERENCE_FILE

log = logging.getLogger(__name__)


def _model(model):
    from workbench.models import load_model

    return load_model(model) if isinstance(model, str) else model


def default_store_path(model, sites: list[str], n_tokens: int, block_len: int, seed: int = 0,
                       source: str | Path | None = None) -> Path:
    """The cache folder of the activations these settings collect: named for people, keyed by a hash of
    everything that changes its content (model weights and dtype, sites, tokens, block length, seed, and the
    text: a local source's files, or the package corpus, which changes with the installed packages)."""
    import hashlib

    from workbench.data.corpus import text_fingerprint
    from workbench.paths import cache_dir, model_folder_name

    info = getattr(model, "workbench", {}) or {}
    name = model_folder_name(info.get("name", model.cfg.model_name))
    key = json.dumps([info.get("weights_sha256"), info.get("dtype", str(model.cfg.dtype)), sites, n_tokens, block_len,
                      "train", seed, text_fingerprint(source)], default=str)
    tag = "-".join(s.replace("blocks.", "L").replace(".hook_", "-") for s in sites)
    return cache_dir("saes", "activations") / f"{name}-{tag}-{n_tokens}-{block_len}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def run_train(model="smollm2-135m", site: str = "blocks.12.hook_resid_post", name: str | None = None,
              architecture: str = "topk", n_tokens: int = 2_000_000, train_tokens: int | None = None,
              d_sae: int | None = None, k: int = 32, l1_coefficient: float = 5.0, normalize: str = "norm",
              lr: float = 4e-4,
              batch_size: int = 1024, block_len: int = 128, source: str | None = None,
              activations: str | None = None, collect_sites: list[str] | None = None,
              collect_budget_s: float | None = None, eval_tokens: int = 4096, overwrite: bool = False,
              seed: int = 0, progress: bool = True, engine: str = "local", workers: int | None = None,
              address: str | None = None, collect_dtype: str | None = None) -> dict:
    """Collect activations (resumable), train one SAE, evaluate it; returns its path and metrics.

    ``n_tokens``: corpus tokens to collect; ``train_tokens``: samples the trainer sees (default: what
    was collected, so more means repeated epochs); ``collect_budget_s`` stops collection early and
    trains on what exists (recorded). ``collect_sites`` lets one store serve several sites. An SAE
    of this ``name`` is reused (or resumed) only if trained with the same settings on the same data;
    other settings are refused before anything is collected, unless ``overwrite``. ``collect_dtype``: the
    activations are collected by a copy of the model in this dtype (bfloat16 ran the forward 3.7x faster on this
    CPU; ``bench/bench_sae_runner.py`` shows what it changes in the SAE), the SAE still evaluated in the model's own.
    """
    from dataclasses import asdict, replace

    require("sae_lens")  # before minutes of collecting, not after

    from workbench.capture import check_sites
    from workbench.data.corpus import token_blocks
    from workbench.paths import model_folder_name, safe_name
    from workbench.sae.load import trained_dir
    from workbench.sae.train import (
        ActivationStore,
        TrainConfig,
        check_int,
        check_number,
        check_sae_folder,
        check_site_matches,
        collect_activations,
        evaluate_sae,
        evaluation_key,
        read_meta,
        site_width,
        store_batches,
        store_identity,
        train_sae,
        update_meta,
    )
    from workbench.store import store_exists

    check_int("n_tokens", n_tokens, low=1)
    check_int("block_len", block_len, low=2)
    check_int("eval_tokens", eval_tokens, low=block_len)
    if train_tokens is not None:
        check_int("train_tokens", train_tokens, low=1)
    if collect_budget_s is not None:
        check_number("budget", collect_budget_s, low=0)
    cfg = TrainConfig(site=site, architecture=architecture, d_sae=d_sae, k=k, l1_coefficient=l1_coefficient,
                      normalize=normalize, lr=lr, batch_size=batch_size, n_tokens=train_tokens or n_tokens, seed=seed)
    if name is not None:
        safe_name(name, "--name")
    model = _model(model)
    info = getattr(model, "workbench", {}) or {}
    model_name = info.get("name", model.cfg.model_name)
    sites = check_sites(model, [*(collect_sites or []), site])
    collector = model
    if collect_dtype is not None and collect_dtype != info.get("dtype"):
        from workbench.models.loading import load_source, model_source

        collector = load_source(model_source(model), dtype=collect_dtype)
    cfg = replace(cfg, model_name=model_name)
    cfg.dict_size(site_width(model, site))
    store_path = str(activations) if activations else default_store_path(collector, sites, n_tokens, block_len, seed,
                                                                          source)
    name = name or f"{model_folder_name(model_name)}-{site.replace('blocks.', 'L').replace('.hook_', '-')}-{architecture}"
    out = trained_dir(name)
    existing = ActivationStore(store_path) if store_exists(store_path) else None
    if existing is not None and existing.manifest.get("weights_sha256") != info.get("weights_sha256"):
        raise WorkbenchError(f"{store_path} holds activations of {existing.manifest.get('model')} with other "
                             f"weights than this {model_name}: collect into another folder")
    # Before collecting, every setting known now; the tokens collected (and a new store's identity) in train_sae.
    unknown = ("n_tokens",) * (train_tokens is None) + ("data",) * (existing is None)
    known = {k_: v for k_, v in asdict(replace(cfg, data=store_identity(existing) if existing else "")).items()
             if k_ not in unknown}
    check_sae_folder(out, known, overwrite, activations=store_path)
    if activations and existing is not None and collect_budget_s == 0:
        store = existing
    else:
        store = collect_activations(collector, sites, store_path, n_tokens, block_len=block_len, split="train",
                                    seed=seed, source=source, time_budget_s=collect_budget_s, progress=progress,
                                    engine=engine, workers=workers, address=address)
    collected = store.n_items(site)  # from the shards' headers: the store is streamed, never held
    if collected < batch_size:
        raise WorkbenchError(f"only {collected} activations in {store_path}: collect more (raise the time budget "
                             "or --n-tokens) or lower --batch-size")
    d_in = int(store.manifest["d"][site][0])
    cfg = replace(cfg, n_tokens=train_tokens or collected, data=store_identity(store))
    sae = train_sae(cfg, store_batches(store, site, batch_size, seed), d_in, out, resume=not overwrite,
                    progress=progress)
    check_site_matches(model, sae)
    eval_blocks = token_blocks(model.tokenizer, eval_tokens, block_len, split="heldout", seed=seed, source=source)
    key = evaluation_key(model, out, eval_blocks, site)
    held = read_meta(out)
    reuse = held.get("metrics_key") == key and isinstance(held.get("metrics"), dict)
    metrics = held["metrics"] if reuse else evaluate_sae(model, sae, eval_blocks)
    meta = update_meta(out, metrics=metrics, metrics_key=key, activations=str(store_path), tokens_collected=collected,
                       store_complete=store.complete, epochs=cfg.n_tokens / collected)
    return {"path": str(out), "name": name, **{k_: meta[k_] for k_ in ("tokens_collected", "tokens_trained", "epochs",
                                                                        "store_complete")}, "metrics": metrics}


def run_features(sae: str, model="smollm2-135m", activations: str | None = None, n_top: int = 16,
                 token_set_frac: float = 0.5, labeller=None, progress: bool = True) -> dict:
    """Describe every live feature of an SAE over its activation store, embed the descriptions (MiniLM)."""
    import numpy as np

    from workbench.io import write_json_atomic
    from workbench.sae.features import describe_features, embed_texts
    from workbench.sae.train import ActivationStore, read_meta

    model = _model(model)
    sae_obj, folder = _load(sae, model)
    store_path = activations or read_meta(folder).get("activations")
    if not store_path:
        raise WorkbenchError("no activation store known for this SAE: pass --activations")
    store = ActivationStore(store_path)
    records = describe_features(model, sae_obj, store, n_top=n_top, token_set_frac=token_set_frac,
                                labeller=labeller, progress=progress)
    emb = embed_texts([r["description"] for r in records])
    tmp = folder / (EMBEDDINGS_FILE + ".tmp")
    with open(tmp, "wb") as fh:  # both files replaced atomically, embeddings first: never a half-written pair
        np.save(fh, emb)
    os.replace(tmp, folder / EMBEDDINGS_FILE)
    write_json_atomic(folder / FEATURES_FILE, records)
    d = sae_obj.cfg.d_sae
    return {"path": str(folder), "n_features": d, "n_described": len(records), "dead_on_store": d - len(records),
            "examples": [{k: r[k] for k in ("feature", "description", "frequency")} for r in records[:5]]}


def run_interference(sae: str, model="smollm2-135m", k: int = 32, min_interference: float = 0.3,
                     cutoff: float = 0.40, coactivation: bool = True, block_size: int = 1024,
                     progress: bool = True, geometry: str = "raw") -> dict:
    """Interference bins and base rates, clusters at the reference cutoffs, unrelated-yet-interfering pairs;
    ``geometry`` "whitened" measures the decoder cosines in the SAE activations' whitened coordinates."""
    import numpy as np

    from workbench.io import write_json_atomic
    from workbench.sae.interference import (
        CUTOFFS,
        check_geometry,
        check_interference_args,
        decoder_geometry,
        interference_scan,
        neuron_connections,
        pair_table,
        semantic_clusters,
        shared_neurons,
        unrelated_interfering,
    )
    from workbench.sae.interference import coactivation as coact
    from workbench.sae.train import ActivationStore, read_meta

    check_interference_args(k, min_interference, cutoff, block_size)
    check_geometry(geometry)
    model = _model(model)
    sae_obj, folder = _load(sae, model)
    if not (folder / FEATURES_FILE).exists():
        raise WorkbenchError(f"{folder} has no feature descriptions: run `workbench sae features` first")
    records = json.loads((folder / FEATURES_FILE).read_text())
    emb = np.load(folder / EMBEDDINGS_FILE)
    feats = [r["feature"] for r in records]
    store_path = read_meta(folder).get("activations")
    store = ActivationStore(store_path) if store_path else None
    scan = interference_scan(decoder_geometry(sae_obj, geometry, store), k=k, block_size=block_size)
    clusters = semantic_clusters(emb, CUTOFFS)
    pairs = pair_table(scan, feats, emb, clusters)
    if pairs:
        ij = [[p["i"], p["j"]] for p in pairs]
        _, connected = neuron_connections(model, sae_obj)
        for p, s in zip(pairs, shared_neurons(connected, ij), strict=True):
            p["shared_neurons"] = float(s)
        if coactivation and store is not None:
            for p, c in zip(pairs, coact(sae_obj, store, ij, progress=progress), strict=True):
                p["coactivation"] = float(c)
    unrelated = unrelated_interfering(pairs, min_interference, cutoff)
    result = {
        "bins": scan["bin_labels"], "bin_counts": scan["bin_counts"], "base_rates": scan["base_rates"],
        "n_pairs": scan["n_pairs"], "k": k, "n_described": len(feats),
        "n_clusters": {f"{c:.2f}": int(len(set(v))) for c, v in clusters.items()},
        "clusters": {f"{c:.2f}": v.tolist() for c, v in clusters.items()}, "features": feats,
        "pairs": pairs, "unrelated_interfering": unrelated[:200], "n_unrelated_interfering": len(unrelated),
        "min_interference": min_interference, "cutoff": cutoff, "geometry": geometry,
    }
    write_json_atomic(folder / INTERFERENCE_FILE, result)
    return {k_: result[k_] for k_ in ("bins", "bin_counts", "base_rates", "n_pairs", "n_described", "n_clusters",
                                      "n_unrelated_interfering")} | {"top_unrelated": unrelated[:10],
                                                                    "path": str(folder / INTERFERENCE_FILE)}


def run_intervene(sae: str, prompt: str, locus: str = "feature", feature: int = 0, scale: float = 8.0,
                  target_feature: int | None = None, model="smollm2-135m", k: int = 30) -> dict:
    """One intervention: next-token top tokens before/after and the shift toward the target feature."""
    from workbench.sae.features import records_by_feature
    from workbench.sae.interventions import check_intervention_args, intervene
    from workbench.sae.train import check_int

    check_intervention_args(locus, scale)
    check_int("k", k, low=1)
    if not isinstance(prompt, str) or not prompt:
        raise WorkbenchError("--prompt is empty: give the text to intervene on")
    model = _model(model)
    sae_obj, folder = _load(sae, model)
    file = folder / FEATURES_FILE
    if not file.exists():
        raise WorkbenchError(f"{folder} has no feature descriptions: run `workbench sae features` first")
    records = records_by_feature(json.loads(file.read_text()))
    return intervene(model, sae_obj, prompt, locus, feature, scale, target_feature, records=records, k=k)


def _load(sae, model):
    from workbench.sae.load import load_sae, trained_dir

    folder = Path(sae) if (Path(sae) / "cfg.json").exists() else trained_dir(str(sae))
    return load_sae(folder if (folder / "cfg.json").exists() else sae, model=model), folder
