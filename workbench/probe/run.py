"""The probe job: does adversarial input change the topology of a model's activations, layer by layer?

Clean and adversarial prompts go through the model; the last-token residual stream of
every chosen layer is captured; per layer, the two point clouds are compared with the
reference study's protocol (K subsampled barcodes per class, summary vectors, effect
sizes, FDR-controlled tests, a cross-validated PH classifier beside a linear probe on
the same rows) and with neuron-level information flow. This module is the analysis;
``workbench.commands.probe`` runs it on a model and writes the run folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections import Counter
from concurrent.futures import as_completed
from dataclasses import replace
from pathlib import Path

import numpy as np

from workbench.conditions import get_condition
from workbench.errors import WorkbenchError
from workbench.io import write_json_atomic
from workbench.probe.config import LAYER_PROTOCOL, MIN_POINTS, ProbeConfig
from workbench.probe.schema import ConditionResult, ConditionSummary, LayerResult
from workbench.topology.signature import COMPRESSION_SIGNATURE

log = logging.getLogger(__name__)


def condition_prompts(model, condition: str, config: ProbeConfig) -> list[dict]:
    """Labelled prompts of one condition, in the model's chat format when it has one (``chat_records``: the
    document is text, so an injected fake turn stays text; only the template's markup is trusted)."""
    from workbench.models import chat_records

    records = distinct_prompts(get_condition(condition).prompts(model, config.n_pairs, seed=config.seed), condition)
    return chat_records(model, records, config.chat)


def distinct_prompts(records: list[dict], condition: str = "") -> list[dict]:
    """``records`` without repeats of a text within its class (the first one kept). A repeated prompt is the same
    point twice, a zero-length H0 bar that no second sample would give: AgentDojo reuses one clean tool output
    for every injection of its vector (138 distinct clean texts in 1,500 pairs), garak a few of its documents."""
    seen, kept = set(), []
    for r in records:
        key = (r.get("label"), r["text"])
        if key not in seen:
            seen.add(key)
            kept.append(r)
    if len(kept) < len(records):
        counts = dict(Counter(r.get("label") for r in kept))
        log.warning("%s: %d repeated prompts dropped (a repeat is the same point twice); distinct per class: %s",
                    condition or "prompts", len(records) - len(kept), counts)
    return kept


def class_clouds(store, site: str, adversarial: str, labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Clean and adversarial rows of one site, validated: both present, finite (``labels``: the store's, if read)."""
    labels = store.labels() if labels is None else labels
    X = store.get(site, as_numpy=True)
    clean, adv = X[labels == "clean"], X[labels == adversarial]
    for name, cloud in (("clean", clean), (adversarial, adv)):
        if len(cloud) == 0:
            raise WorkbenchError(f"the store at {store.path} has no {name!r} rows: label rows clean/{adversarial}")
        bad = np.flatnonzero(~np.isfinite(cloud).all(1))
        if bad.size:
            raise WorkbenchError(f"{site}: {name} rows {bad[:5].tolist()} hold NaN/inf activations; check the model dtype")
    ratio = min(len(clean), len(adv)) / max(len(clean), len(adv))
    if ratio < 0.2:
        log.warning("classes are unbalanced (%d clean vs %d %s): subsample sizes follow the smaller class",
                    len(clean), len(adv), adversarial)
    return clean, adv


def analyze_layer(clean: np.ndarray, adv: np.ndarray, config: ProbeConfig, seed: int, layer: int = -1,
                  n_threads: int | None = None) -> LayerResult:
    """The subsample protocol for one layer, plus one example diagram per class for the report (``n_threads``:
    giotto-ph's threads per diagram)."""
    from workbench.topology.diagrams import diagrams_to_lists
    from workbench.topology.persistence import rips_persistence
    from workbench.topology.stats import compare_conditions

    smaller = min(len(clean), len(adv))
    k = min(config.k, smaller // config.n_parts)
    if k < MIN_POINTS:
        raise WorkbenchError(
            f"too few rows for the subsample protocol: {smaller} in the smaller class gives {k} points per "
            f"subsample over {config.n_parts} parts; use more prompts (--pairs) or fewer parts"
        )
    cmp = compare_conditions({0: (clean, adv)}, k=k, K=config.K, n_parts=config.n_parts, maxdim=config.maxdim,
                             n_boot=config.n_boot, n_perm=config.n_perm, seed=seed,
                             n_threads=n_threads)
    rng = np.random.default_rng(seed)
    examples = {}
    for name, cloud in (("clean", clean), ("adversarial", adv)):
        rows = rng.choice(len(cloud), size=k, replace=False)
        result = rips_persistence(cloud[rows], maxdim=config.maxdim, n_threads=n_threads)
        examples[name] = diagrams_to_lists(result.dgms)
    return LayerResult(
        layer=layer, k=k, n_clean=len(clean), n_adversarial=len(adv), features=list(cmp.names),
        mean_clean=cmp.mean_a[0].tolist(), mean_adversarial=cmp.mean_b[0].tolist(),
        g=cmp.g[0].tolist(), g_low=cmp.g_low[0].tolist(), g_high=cmp.g_high[0].tolist(),
        p_welch=cmp.p_welch[0].tolist(), p_perm=cmp.p_perm[0].tolist(), p_parts=cmp.p_parts[0].tolist(),
        auc_topology=float(cmp.auc_topology[0]), auc_probe_rows=float(cmp.auc_probe_rows[0]),
        auc_probe_means=float(cmp.auc_probe_means[0]), example_diagrams=examples, protocol=LAYER_PROTOCOL,
    )


def analyze_condition(store, condition: str, config: ProbeConfig, work: Path, progress: bool = True,
                      n_jobs: int | None = 1) -> ConditionResult:
    """Every layer of one condition (cached per layer in ``work``), then FDR across layers x features.

    Layers are independent: with ``n_jobs`` > 1 (None: one per core) and work enough to repay a pool's start
    (``PARALLEL_MIN_WORK``) they run in worker processes, each layer with its own seed (the same results), each
    cached as it finishes. One process is the default: on 2 cores the pool took 21 s against 26-28 s in one
    process for the default probe's 30 layers, but 37-54 s whenever the parent held a loaded model (as the probe
    does; cause not found), so it pays only where no model is loaded."""
    from workbench.parallel import n_workers, process_pool
    from workbench.progress import progress_bar
    from workbench.topology.stats import benjamini_hochberg

    adversarial = get_condition(condition).adversarial_label
    work.mkdir(parents=True, exist_ok=True)
    layers: dict[int, LayerResult] = {}
    todo = []
    for index, site in enumerate(store.sites):
        layer = int(site.split(".")[1])
        cached = work / f"layer-{layer:03d}.json"
        key = layer_key(store, site, adversarial, config, seed=config.seed + 1000 * index)
        if cached.exists():
            with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError, TypeError, KeyError):
                held = LayerResult.from_dict(json.loads(cached.read_text()), layer)
                if held.key == key:
                    layers[layer] = held
                    continue
            log.info("recomputing %s: its cache was made from other inputs", cached)
        todo.append((site, layer, config.seed + 1000 * index, key, cached))
    labels = store.labels() if todo else None
    jobs = n_workers(n_jobs, len(todo)) if config.K * config.k >= PARALLEL_MIN_WORK else 1
    bar = progress_bar(total=len(store.sites), initial=len(layers), desc=f"topology {condition}", unit="layer",
                       disable=not progress)

    def finish(layer, key, cached, result):
        layers[layer] = replace(result, key=key)
        write_json_atomic(cached, layers[layer].to_dict())
        bar.update()

    with bar, process_pool(jobs) as pool:
        running = {}
        for site, layer, seed, key, cached in todo:
            clean, adv = class_clouds(store, site, adversarial, labels)
            if pool is None:
                finish(layer, key, cached, analyze_layer(clean, adv, config, seed, layer))
            else:
                running[pool.submit(analyze_layer, clean, adv, config, seed, layer, 1)] = (layer, key, cached)
        for future in as_completed(running):
            finish(*running[future], future.result())
    order = sorted(layers)
    q = {name: benjamini_hochberg(np.array([getattr(layers[L], p) for L in order]))
         for name, p in (("q_perm", "p_perm"), ("q_welch", "p_welch"), ("q_parts", "p_parts"))}
    for i, L in enumerate(order):
        r = replace(layers[L], **{name: values[i].tolist() for name, values in q.items()})
        layers[L] = replace(r, moved=moved_features(r.features, r.g, r.q_perm),
                            signature=signature_agreement(r.features, r.g, r.q_perm))
    layers = {L: layers[L] for L in order}
    return ConditionResult(condition=condition, adversarial_label=adversarial, sites=list(store.sites), layers=layers,
                           summary=ConditionSummary.of(layers))


PARALLEL_MIN_WORK = 2048  # K x k per layer below which one process is faster than starting a pool (~2 s)


def layer_key(store, site: str, adversarial: str, config: ProbeConfig, seed: int) -> str:
    """Everything a cached layer result depends on: the store's rows and weights, the site and the protocol."""
    m = store.manifest
    analysis = {k: getattr(config, k) for k in ("k", "K", "n_parts", "maxdim", "n_boot", "n_perm")}
    blob = [LAYER_PROTOCOL, analysis, seed, adversarial, site, m.get("model"), m.get("weights_sha256"),
            m.get("model_dtype"), m.get("attention"), m.get("prompts_sha256"), m.get("dtype"), m.get("max_tokens"), store.n_rows]
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]


def moved_features(names: list[str], g: list[float], q: list[float], alpha: float = 0.05) -> list[str]:
    """Sentences for the features that moved (q < alpha), largest effect first."""
    hits = sorted((i for i, qi in enumerate(q) if qi < alpha), key=lambda i: -abs(g[i]))
    return [f"{names[i]} {'higher' if g[i] > 0 else 'lower'} under attack (g = {g[i]:+.2f}, q = {q[i]:.3g})"
            for i in hits]


def signature_agreement(names: list[str], g: list[float], q: list[float], alpha: float = 0.05) -> dict:
    """Per signature feature: 'agrees' / 'opposes' (significant) or 'n.s.'."""
    out = {}
    for feature, sign in COMPRESSION_SIGNATURE.items():
        if feature not in names:
            continue
        i = names.index(feature)
        significant = q[i] < alpha  # a NaN q (untestable feature) is not significant
        out[feature] = "agrees" if significant and np.sign(g[i]) == sign else "opposes" if significant else "n.s."
    return out


def flow_by_class(store, condition: str, config: ProbeConfig) -> dict:
    """Neuron-level flow per class (and its permutation control) over the captured layers."""
    from scipy.stats import ttest_ind

    from workbench.topology.neuron_flow import neuron_flow

    if config.flow_samples <= 0 or len(store.sites) < 2:
        return {}
    adversarial = get_condition(condition).adversarial_label
    rng = np.random.default_rng(config.seed)
    labels = store.labels()
    sites = [store.get(site, as_numpy=True) for site in store.sites]  # each site read once, for both classes
    per_class = {}
    for name, label in (("clean", "clean"), ("adversarial", adversarial)):
        rows = np.flatnonzero(labels == label)
        rows = rng.choice(rows, size=min(config.flow_samples, len(rows)), replace=False)
        acts = np.stack([values[rows] for values in sites], axis=1)
        per_class[name] = {
            "flow": neuron_flow(acts, gaps=config.flow_gaps, normalize=True, seed=config.seed),
            "control": neuron_flow(acts, gaps=config.flow_gaps, normalize=True, permute=True, seed=config.seed),
        }
    layers = [int(s.split(".")[1]) for s in store.sites]
    out = {"layers": layers, "gaps": {}}
    for gap in per_class["clean"]["flow"].gaps:
        entry = {}
        for kind in ("flow", "control"):
            a = per_class["clean"][kind].totals[gap].mean(0)  # per sample, averaged over layer pairs
            b = per_class["adversarial"][kind].totals[gap].mean(0)
            entry[kind] = {
                "clean_curve": per_class["clean"][kind].curve(gap).tolist(),
                "adversarial_curve": per_class["adversarial"][kind].curve(gap).tolist(),
                "clean_mean": float(a.mean()), "adversarial_mean": float(b.mean()),
                "p_welch": float(ttest_ind(a, b, equal_var=False).pvalue),
            }
        entry["pairs"] = [list(p) for p in per_class["clean"]["flow"].pairs[gap]]
        out["gaps"][str(gap)] = entry
    return out
