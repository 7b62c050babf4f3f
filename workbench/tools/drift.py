"""What a model tool does to the model's topology and SAE features, measured against the unmodified model.

A tool is a set of hooks (a quantization setting, a sparse-attention method, a steering vector). The
same tokens run with and without it, and per layer we compare the residual stream (BOS left out: its
huge norm would dominate every figure; ``relative_l2`` also gives the L2 drift with it):

- **topology drift**: the Rips persistence of the same ``k`` token positions in both runs; bottleneck
  distances between the H0 and the H1 diagrams, divided by the reference cloud's largest H0 death so
  layers of different scales compare; and the relative change of the compression-signature features
  (does the tool itself "compress" the topology, as an attack does?);
- **SAE drift** at an SAE's site: the fraction of variance it leaves unexplained on the reference and
  on the tool's activations, and the Jaccard overlap of the active features per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from workbench.errors import WorkbenchError
from workbench.topology.signature import SIGNATURE_FEATURES


def site_activations(model, tokens: torch.Tensor, sites: Sequence[str]) -> dict[str, torch.Tensor]:
    """``{site: (batch, pos, d)}`` in float32, under whatever hooks the caller has made active."""
    wanted = set(sites)
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in wanted, return_type=None)
    return {n: cache[n].float() for n in sites}


def token_rows(acts: dict[str, torch.Tensor], sites: Sequence[str]) -> dict[str, torch.Tensor]:
    """``{site: (n_tokens, d)}``: every position but the first (BOS), as the drift measures want them."""
    return {n: acts[n][:, 1:].reshape(-1, acts[n].shape[-1]) for n in sites}


def relative_l2(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor], sites: Sequence[str],
                start: int = 0) -> list[float]:
    """``||got - ref|| / ||ref||`` per site over positions ``>= start`` of ``(batch, pos, d)`` activations."""
    return [((got[n][:, start:] - ref[n][:, start:]).norm() / ref[n][:, start:].norm()).item() for n in sites]


def cloud_signatures(clouds: dict, k: int = 128, seed: int = 0, maxdim: int = 1) -> dict:
    """Persistence of ``k`` rows of each layer's cloud, the same rows for every call with the same seed."""
    from workbench.topology.persistence import rips_persistence

    out = {}
    for L, X in clouds.items():
        rows = np.random.default_rng(seed).choice(len(X), size=min(k, len(X)), replace=False)
        out[L] = rips_persistence(X[np.sort(rows)].numpy(), maxdim=maxdim)
    return out


def topology_drift(ref: dict, got: dict) -> dict[str, dict]:
    """Per site: relative bottleneck distances (H0, H1) and relative change of the signature features."""
    from workbench.topology.summaries import BarcodeSummary, bottleneck_distance

    summary = BarcodeSummary(dims=(0, 1)).fit([ref[L] for L in ref])
    names = list(summary.get_feature_names_out())
    out: dict[str, dict] = {"bottleneck_h0": {}, "bottleneck_h1": {}}
    out |= {f"{f}_change": {} for f in SIGNATURE_FEATURES}
    for L in ref:
        deaths = ref[L].dgms[0][:, 1]
        scale = float(np.max(deaths[np.isfinite(deaths)], initial=0.0)) or 1.0
        for dim in (0, 1):
            out[f"bottleneck_h{dim}"][L] = bottleneck_distance(ref[L].dgms[dim], got[L].dgms[dim]) / scale
        a, b = summary.transform([ref[L], got[L]])
        for f in SIGNATURE_FEATURES:
            i = names.index(f)
            out[f"{f}_change"][L] = float((b[i] - a[i]) / abs(a[i])) if a[i] else float(b[i] != a[i])
    return out


def sae_drift(sae, ref: torch.Tensor, got: torch.Tensor) -> dict[str, float]:
    """Unexplained variance on reference vs tool activations, and the per-token Jaccard of active features."""

    def fvu(x, recon):
        return float(((x - recon) ** 2).sum() / ((x - x.mean(0)) ** 2).sum())

    with torch.inference_mode():
        za, zb = sae.encode(ref), sae.encode(got)
        fa, fb = fvu(ref, sae.decode(za)), fvu(got, sae.decode(zb))
    a, b = za > 0, zb > 0
    union = (a | b).sum(1).clamp(min=1)
    jaccard = float(((a & b).sum(1) / union).mean())
    return {"sae_fvu_ref": fa, "sae_fvu": fb, "sae_fvu_ratio": fb / fa if fa else float("nan"),
            "sae_active_jaccard": jaccard}


def check_layers(model, layers: Sequence[int] | None) -> list[int]:
    """``layers`` as a list if each is a distinct layer of ``model``, else a one-line error (before any work)."""
    layers = list(layers or [])
    n = model.cfg.n_layers
    for L in layers:
        if isinstance(L, bool) or not isinstance(L, int | np.integer) or not 0 <= L < n:
            raise WorkbenchError(f"topology layer {L!r} is not a layer of this {n}-layer model: use 0..{n - 1}")
    if len(set(layers)) < len(layers):
        raise WorkbenchError(f"topology layers {layers} name a layer twice: list each once")
    return layers


def load_sae_for(model, sae):
    """``sae`` (a trained name, folder, or an SAE already loaded) checked against ``model``; None stays None."""
    if not isinstance(sae, str | Path):
        return sae
    from workbench.sae.load import load_sae

    return load_sae(sae, model=model)


class DriftMeter:
    """Topology and SAE drift of any tool against a reference run: ``set_reference(streams)`` once, then
    ``measure(streams)`` per tool setting, where streams are ``{site: (n_tokens, d)}`` of the same tokens."""

    def __init__(self, model, layers: Sequence[int] | None = None, k: int = 128, sae=None, seed: int = 0):
        """``sae``: an SAE, or a trained SAE's name or folder (loaded and checked against ``model``)."""
        if not isinstance(k, int) or k < 3:
            raise WorkbenchError(f"topology_k={k!r}: persistence needs at least 3 token positions per layer")
        layers = check_layers(model, layers)
        sae = load_sae_for(model, sae)
        self.k, self.sae, self.seed = k, sae, seed
        self.topology_sites = [f"blocks.{L}.hook_resid_post" for L in layers]
        self.sae_site = None
        if sae is not None:
            from workbench.sae.train import check_site_matches

            self.sae_site = check_site_matches(model, sae)
        self.sites = list(dict.fromkeys(self.topology_sites + ([self.sae_site] if self.sae_site else [])))

    def fingerprint(self) -> str:
        """What this meter's columns depend on besides the streams: its layers, k, seed and the SAE (weights and
        config), as a short hash for the keys of cached results."""
        import hashlib
        import json

        from workbench.models.loading import state_sha256

        sae = None if self.sae is None else [self.sae.cfg.to_dict(), state_sha256(self.sae)]
        blob = json.dumps([self.topology_sites, self.k, self.seed, self.sae_site, sae], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def set_reference(self, streams: dict[str, torch.Tensor]) -> None:
        self.ref = streams
        self.ref_topology = cloud_signatures({n: streams[n] for n in self.topology_sites}, self.k, self.seed)

    def measure(self, streams: dict[str, torch.Tensor]) -> dict:
        """Drift columns: means over the layers, per-layer lists, and the SAE's figures."""
        out: dict = {}
        if self.topology_sites:
            got = cloud_signatures({n: streams[n] for n in self.topology_sites}, self.k, self.seed)
            out["ph_layers"] = [int(n.split(".")[1]) for n in self.topology_sites]
            for key, per_site in topology_drift(self.ref_topology, got).items():
                values = [per_site[n] for n in self.topology_sites]
                out[f"ph_{key}_mean"] = float(np.mean(values))
                out[f"ph_{key}_per_layer"] = values
        if self.sae_site:
            out |= sae_drift(self.sae, self.ref[self.sae_site], streams[self.sae_site])
        return out


def has_drift(rows: Sequence[dict]) -> bool:
    return bool(rows) and ("ph_bottleneck_h1_mean" in rows[0] or "sae_fvu" in rows[0])


def drift_figure(rows: Sequence[dict], label: str, title: str):
    """Plotly figure: H0/H1 bottleneck drift per layer for each row (a setting or method), and the SAE's
    unexplained variance and active-feature overlap per row."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "H0 bottleneck / largest H0 death", "H1 bottleneck / largest H0 death",
        "SAE: unexplained variance, active-feature Jaccard vs reference"))
    from workbench.report import readable_layout, setting_colours

    names = [r[label] for r in rows]
    colours = setting_colours(names)
    for r in rows:
        for col, dim in ((1, 0), (2, 1)):
            if f"ph_bottleneck_h{dim}_per_layer" in r:
                fig.add_scatter(x=r["ph_layers"], y=r[f"ph_bottleneck_h{dim}_per_layer"], mode="lines+markers",
                                name=f"{r[label]} H{dim}", legendgroup=r[label], row=1, col=col,
                                line={"color": colours[r[label]]}, marker={"symbol": "circle" if dim == 0 else "x"})
    if "sae_fvu" in rows[0]:
        fig.add_bar(x=names, y=[r["sae_fvu"] for r in rows], name="SAE unexplained variance", row=1, col=3)
        fig.add_bar(x=names, y=[r["sae_active_jaccard"] for r in rows], name="active-feature Jaccard", row=1, col=3)
    fig.update_xaxes(title_text="layer", row=1, col=1)
    fig.update_xaxes(title_text="layer", row=1, col=2)
    return readable_layout(fig, title, height=540)
