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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from workbench.conditions import CONDITIONS, get_condition
from workbench.errors import WorkbenchError
from workbench.io import write_json_atomic
from workbench.topology.signature import COMPRESSION_SIGNATURE

log = logging.getLogger(__name__)

LAYER_PROTOCOL = 2  # bump when analyze_layer's output changes: cached layers of another protocol are recomputed
MIN_POINTS = 10  # fewest points per subsampled cloud the protocol accepts


@dataclass
class ProbeConfig:
    """Everything a probe run depends on; written beside its results."""

    model: str = "smollm2-135m"
    conditions: tuple[str, ...] = ("injection",)
    layers: list[int] | None = None  # None: every layer
    n_pairs: int = 500  # clean/adversarial pairs per condition
    k: int = 100  # points per subsampled cloud (capped by the rows available)
    K: int = 64  # subsamples per class and layer
    n_parts: int = 5  # disjoint row parts (CV folds; no row in both train and test)
    maxdim: int = 1
    n_boot: int = 1000
    n_perm: int = 2000
    flow_samples: int = 24  # prompts per class for neuron-level flow (0: skip)
    flow_gaps: tuple[int, ...] = (1, 3, 10)
    batch_size: int = 8
    chat: bool = True  # wrap prompts in the model's chat template when it has one
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        """Refuse values the protocol cannot run, before anything is captured or written."""
        bad = [c for c in self.conditions if c not in CONDITIONS]
        if bad or not self.conditions:
            raise WorkbenchError(f"unknown condition {(bad or [''])[0]!r}: use one of {', '.join(CONDITIONS)} or both")
        for name in ("n_pairs", "k", "K", "n_parts", "n_boot", "n_perm", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                option = {"n_pairs": "--pairs", "batch_size": "--batch-size"}.get(name, name)
                raise WorkbenchError(f"{option} must be a positive integer, got {value!r}")
        if self.n_parts < 2:
            raise WorkbenchError(f"n_parts must be at least 2 (train/test parts), got {self.n_parts}")
        if self.maxdim not in (0, 1, 2):
            raise WorkbenchError(f"maxdim must be 0, 1 or 2, got {self.maxdim!r}")
        if self.seed < 0:
            raise WorkbenchError(f"seed must be a non-negative integer, got {self.seed}")
        if self.flow_samples < 0 or any(int(g) < 1 for g in self.flow_gaps):
            raise WorkbenchError("flow_samples must be >= 0 and flow_gaps positive layer distances")

    def check_protocol(self) -> None:
        """Enough pairs for the subsample protocol (checked before a probe captures anything)."""
        if self.n_pairs // self.n_parts < MIN_POINTS:
            raise WorkbenchError(
                f"--pairs {self.n_pairs} is too few: the subsample protocol needs at least {MIN_POINTS} points per "
                f"part over {self.n_parts} parts, i.e. --pairs {MIN_POINTS * self.n_parts} or more"
            )

    def key(self, weights_sha256: str | None = None) -> str:
        """A short hash of everything that changes this run's results (batch size does not: batching is exact)."""
        fields = {k: v for k, v in asdict(self).items() if k != "batch_size"}
        blob = json.dumps([fields, weights_sha256, LAYER_PROTOCOL], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @classmethod
    def quick(cls, **overrides) -> ProbeConfig:
        """A ~2-minute version on the embedded default: fewer prompts, layers and subsamples."""
        base = cls(n_pairs=80, k=30, K=12, n_parts=2, n_boot=200, n_perm=500, flow_samples=8, flow_gaps=(1, 3))
        return replace(base, **overrides)


def condition_prompts(model, condition: str, config: ProbeConfig) -> list[dict]:
    """Labelled prompts of one condition, in the model's chat format when it has one (``chat_records``: the
    document is text, so an injected fake turn stays text; only the template's markup is trusted)."""
    from workbench.models import chat_records

    records = get_condition(condition).prompts(model, config.n_pairs, seed=config.seed)
    return chat_records(model, records, config.chat)


def class_clouds(store, site: str, adversarial: str) -> tuple[np.ndarray, np.ndarray]:
    """Clean and adversarial rows of one site, validated: both present, finite."""
    labels = store.labels()
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


def analyze_layer(clean: np.ndarray, adv: np.ndarray, config: ProbeConfig, seed: int) -> dict:
    """The subsample protocol for one layer, plus one example diagram per class for the report."""
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
                             n_boot=config.n_boot, n_perm=config.n_perm, seed=seed)
    rng = np.random.default_rng(seed)
    examples = {}
    for name, cloud in (("clean", clean), ("adversarial", adv)):
        rows = rng.choice(len(cloud), size=k, replace=False)
        result = rips_persistence(cloud[rows], maxdim=config.maxdim)
        examples[name] = diagrams_to_lists(result.dgms)
    return {
        "k": k, "n_clean": len(clean), "n_adversarial": len(adv), "features": cmp.names,
        "mean_clean": cmp.mean_a[0].tolist(), "mean_adversarial": cmp.mean_b[0].tolist(),
        "g": cmp.g[0].tolist(), "g_low": cmp.g_low[0].tolist(), "g_high": cmp.g_high[0].tolist(),
        "p_welch": cmp.p_welch[0].tolist(), "p_perm": cmp.p_perm[0].tolist(), "p_parts": cmp.p_parts[0].tolist(),
        "protocol": LAYER_PROTOCOL, "auc_topology": float(cmp.auc_topology[0]), "auc_probe_rows": float(cmp.auc_probe_rows[0]),
        "auc_probe_means": float(cmp.auc_probe_means[0]), "example_diagrams": examples,
    }


def analyze_condition(store, condition: str, config: ProbeConfig, work: Path, progress: bool = True) -> dict:
    """Every layer of one condition (cached per layer in ``work``), then FDR across layers x features."""
    from tqdm.auto import tqdm

    from workbench.topology.stats import benjamini_hochberg

    adversarial = get_condition(condition).adversarial_label
    work.mkdir(parents=True, exist_ok=True)
    layers = {}
    for index, site in enumerate(tqdm(store.sites, desc=f"topology {condition}", unit="layer", disable=not progress)):
        layer = int(site.split(".")[1])
        cached = work / f"layer-{layer:03d}.json"
        key = layer_key(store, site, adversarial, config, seed=config.seed + 1000 * index)
        if cached.exists():
            with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):
                layers[layer] = json.loads(cached.read_text())
                if layers[layer].get("key") == key:
                    continue
            log.info("recomputing %s: its cache was made from other inputs", cached)
        clean, adv = class_clouds(store, site, adversarial)
        layers[layer] = {**analyze_layer(clean, adv, config, seed=config.seed + 1000 * index), "key": key}
        write_json_atomic(cached, layers[layer])
    order = sorted(layers)
    names = layers[order[0]]["features"]
    q_perm = benjamini_hochberg(np.array([layers[L]["p_perm"] for L in order]))
    q_welch = benjamini_hochberg(np.array([layers[L]["p_welch"] for L in order]))
    q_parts = benjamini_hochberg(np.array([layers[L]["p_parts"] for L in order]))
    for i, L in enumerate(order):
        layers[L]["q_perm"], layers[L]["q_welch"] = q_perm[i].tolist(), q_welch[i].tolist()
        layers[L]["q_parts"] = q_parts[i].tolist()
        layers[L]["moved"] = moved_features(names, layers[L]["g"], layers[L]["q_perm"])
        layers[L]["signature"] = signature_agreement(names, layers[L]["g"], layers[L]["q_perm"])
    result = {"adversarial_label": adversarial, "sites": store.sites, "layers": {str(L): layers[L] for L in order}}
    result["summary"] = condition_summary(layers, order)
    return result


def layer_key(store, site: str, adversarial: str, config: ProbeConfig, seed: int) -> str:
    """Everything a cached layer result depends on: the store's rows and weights, the site and the protocol."""
    m = store.manifest
    analysis = {k: getattr(config, k) for k in ("k", "K", "n_parts", "maxdim", "n_boot", "n_perm")}
    blob = [LAYER_PROTOCOL, analysis, seed, adversarial, site, m.get("model"), m.get("weights_sha256"),
            m.get("prompts_sha256"), m.get("dtype"), m.get("max_tokens"), store.n_rows]
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


def condition_summary(layers: dict, order: list[int]) -> dict:
    auc = {L: layers[L]["auc_topology"] for L in order}
    probe = {L: layers[L]["auc_probe_rows"] for L in order}
    agree = {L: sum(v == "agrees" for v in layers[L]["signature"].values()) for L in order}
    oppose = {L: sum(v == "opposes" for v in layers[L]["signature"].values()) for L in order}
    best = max(order, key=lambda L: auc[L])
    return {
        "best_topology_layer": best, "best_topology_auc": auc[best],
        "mean_topology_auc": float(np.mean(list(auc.values()))), "mean_probe_auc": float(np.mean(list(probe.values()))),
        "layers_with_signature": [L for L in order if agree[L] >= 3 and oppose[L] == 0],
        "signature_agreements": agree, "signature_oppositions": oppose,
    }


def flow_by_class(store, condition: str, config: ProbeConfig) -> dict:
    """Neuron-level flow per class (and its permutation control) over the captured layers."""
    from scipy.stats import ttest_ind

    from workbench.topology.neuron_flow import neuron_flow

    if config.flow_samples <= 0 or len(store.sites) < 2:
        return {}
    adversarial = get_condition(condition).adversarial_label
    rng = np.random.default_rng(config.seed)
    labels = store.labels()
    per_class = {}
    for name, label in (("clean", "clean"), ("adversarial", adversarial)):
        rows = np.flatnonzero(labels == label)
        rows = rng.choice(rows, size=min(config.flow_samples, len(rows)), replace=False)
        acts = np.stack([store.get(site, as_numpy=True)[rows] for site in store.sites], axis=1)
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


def summary_table(report: dict) -> list[dict]:
    """The compact per-layer table the CLI prints."""
    rows = []
    for condition, result in report["conditions"].items():
        for layer, r in result["layers"].items():
            names = r["features"]

            def g(feature, names=names, r=r):
                return r["g"][names.index(feature)] if feature in names else float("nan")

            rows.append({
                "condition": condition, "layer": int(layer), "auc_ph": r["auc_topology"], "auc_probe": r["auc_probe_rows"],
                "g_h0_death_mean": g("h0_death_mean"), "g_h1_count": g("h1_count"),
                "g_h1_persistence_mean": g("h1_persistence_mean"), "g_h1_entropy": g("h1_entropy"),
                "n_moved": len(r["moved"]),
                "signature": sum(v == "agrees" for v in r["signature"].values()),
            })
    return rows


def report_rows(report: dict) -> list[dict]:
    """One row per condition and layer: AUCs and, per signature feature, class means, g with CI, q, verdict."""
    rows = []
    for condition, result in report["conditions"].items():
        for layer, r in result["layers"].items():
            row = {"model": report["model"].get("name"), "condition": condition, "layer": int(layer), "k": r["k"],
                   "auc_ph": r["auc_topology"], "auc_probe_rows": r["auc_probe_rows"],
                   "auc_probe_means": r["auc_probe_means"], "n_moved": len(r["moved"])}
            for feature in COMPRESSION_SIGNATURE:
                i = r["features"].index(feature)
                row |= {f"{feature}_clean": r["mean_clean"][i], f"{feature}_attack": r["mean_adversarial"][i],
                        f"{feature}_g": r["g"][i], f"{feature}_g_low": r["g_low"][i], f"{feature}_g_high": r["g_high"][i],
                        f"{feature}_q": r["q_perm"][i], f"{feature}_q_parts": r["q_parts"][i],
                        f"{feature}_verdict": r["signature"][feature]}
            rows.append(row)
    return rows
