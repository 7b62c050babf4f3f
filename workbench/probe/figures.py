"""What a probe report looks like: its tables and figures (plotly), shared by ``workbench probe``, the app and
the studies. Everything here reads the typed records of ``workbench.probe.schema``."""

from __future__ import annotations

import numpy as np

from workbench.probe.schema import ConditionResult, LayerResult, ProbeReport
from workbench.report import html_table, write_html
from workbench.topology.diagrams import diagrams_from_lists
from workbench.topology.signature import COMPRESSION_SIGNATURE


def summary_table(report: ProbeReport) -> list[dict]:
    """The compact per-layer table the CLI prints and the app shows."""
    return [{
        "condition": name, "layer": L, "auc_ph": r.auc_topology, "auc_probe": r.auc_probe_rows,
        "g_h0_death_mean": r.value("g", "h0_death_mean"), "g_h1_count": r.value("g", "h1_count"),
        "g_h1_persistence_mean": r.value("g", "h1_persistence_mean"), "g_h1_entropy": r.value("g", "h1_entropy"),
        "n_moved": len(r.moved), "signature": r.signature_agrees,
    } for name, result in report.conditions.items() for L, r in result.layers.items()]


def report_rows(report: ProbeReport) -> list[dict]:
    """One row per condition and layer: AUCs and, per signature feature, class means, g with CI, q, verdict."""
    rows = []
    for name, result in report.conditions.items():
        for L, r in result.layers.items():
            row = {"model": report.model.get("name"), "condition": name, "layer": L, "k": r.k,
                   "auc_ph": r.auc_topology, "auc_probe_rows": r.auc_probe_rows,
                   "auc_probe_means": r.auc_probe_means, "n_moved": len(r.moved)}
            for feature in COMPRESSION_SIGNATURE:
                row |= {f"{feature}_clean": r.value("mean_clean", feature),
                        f"{feature}_attack": r.value("mean_adversarial", feature),
                        f"{feature}_g": r.value("g", feature), f"{feature}_g_low": r.value("g_low", feature),
                        f"{feature}_g_high": r.value("g_high", feature), f"{feature}_q": r.value("q_perm", feature),
                        f"{feature}_q_parts": r.value("q_parts", feature),
                        f"{feature}_verdict": r.signature.get(feature, "n.s.")}
            rows.append(row)
    return rows


def auc_figure(result: ConditionResult, title: str):
    import plotly.graph_objects as go

    layers = list(result.layers)
    fig = go.Figure()
    values = [getattr(r, key) for r in result.layers.values()
              for key in ("auc_topology", "auc_probe_rows", "auc_probe_means")]
    low = min([0.4, *(v - 0.03 for v in values if v is not None and v == v)])  # never hide an AUC below 0.4
    for key, name in (("auc_topology", "PH summary + logistic regression"),
                      ("auc_probe_rows", "linear probe, per prompt"),
                      ("auc_probe_means", "linear probe, subsample means")):
        fig.add_trace(go.Scatter(x=layers, y=[getattr(r, key) for r in result.layers.values()], mode="lines+markers",
                                 name=name))
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="cross-validated AUC", yaxis_range=[low, 1.02],
                      template="plotly_white", height=420)
    return fig


def effect_heatmap(result: ConditionResult, title: str):
    import plotly.graph_objects as go

    layers = list(result.layers)
    names = result.layers[layers[0]].features
    g = np.array([result.layers[L].g for L in layers])
    q = np.array([result.layers[L].q_perm for L in layers])
    text = np.where(q < 0.05, "*", "")
    lim = float(np.nanmax(np.abs(g))) or 1.0
    fig = go.Figure(go.Heatmap(z=g, x=names, y=[f"L{L}" for L in layers], colorscale="RdBu_r", zmin=-lim, zmax=lim,
                               text=text, texttemplate="%{text}", colorbar={"title": "Hedges g"}))
    fig.update_layout(title=title + " (attack - clean; * q<0.05 permutation, BH)", height=300 + 14 * len(layers),
                      template="plotly_white")
    return fig


def signature_figure(result: ConditionResult, title: str):
    import plotly.graph_objects as go

    layers = list(result.layers)
    rows = list(result.layers.values())
    fig = go.Figure()
    for feature, sign in COMPRESSION_SIGNATURE.items():
        if feature not in rows[0].features:
            continue
        g = np.array([r.value("g", feature) for r in rows])
        lo, hi = np.array([r.value("g_low", feature) for r in rows]), np.array([r.value("g_high", feature) for r in rows])
        fig.add_trace(go.Scatter(x=layers, y=g, mode="lines+markers", name=f"{feature} (expected {'+' if sign > 0 else '-'})",
                                 error_y={"type": "data", "symmetric": False, "array": hi - g, "arrayminus": g - lo}))
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="Hedges g with 95% bootstrap CI",
                      template="plotly_white", height=420)
    return fig


def betti_figure(layer_result: LayerResult, title: str, dim: int = 1):
    """Betti curves of the example clean and adversarial subsamples on a common scale."""
    import plotly.graph_objects as go

    from workbench.topology.summaries import BettiCurve

    diagrams = {name: diagrams_from_lists(d) for name, d in layer_result.example_diagrams.items()}
    fig = go.Figure()
    if any(len(d) <= dim for d in diagrams.values()):
        return fig
    bars = np.concatenate([d[dim][np.isfinite(d[dim][:, 1])] for d in diagrams.values()])
    if len(bars) == 0:
        return fig
    lo, hi = float(bars[:, 0].min()), float(bars[:, 1].max())
    curve = BettiCurve(dim=dim, resolution=200, sample_range=(lo, hi)).fit(list(diagrams.values()))
    values = curve.transform(list(diagrams.values()))
    grid = np.linspace(lo, hi, values.shape[1])
    for (name, _), row in zip(diagrams.items(), values, strict=True):
        fig.add_trace(go.Scatter(x=grid, y=row, mode="lines", name=name))
    fig.update_layout(title=title, xaxis_title="scale", yaxis_title=f"Betti {dim}", template="plotly_white", height=380)
    return fig


def flow_figure(flow: dict, title: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    shades = {"clean": ("#1f77b4", "#08306b", "#6baed6", "#4292c6"),  # a shade per gap within each class's hue
              "adversarial": ("#d62728", "#67000d", "#fb6a4a", "#cb181d")}
    for i, (gap, entry) in enumerate(flow.get("gaps", {}).items()):
        x = [p[0] for p in entry["pairs"]]
        for kind, dash in (("flow", "solid"), ("control", "dot")):
            for cls in ("clean", "adversarial"):
                colour = shades[cls][i % len(shades[cls])]
                fig.add_trace(go.Scatter(x=x, y=entry[kind][f"{cls}_curve"], mode="lines",
                                         line={"dash": dash, "color": colour}, legendgroup=f"gap {gap}",
                                         name=f"gap {gap} {cls}{' (permuted control)' if kind == 'control' else ''}"))
    fig.update_layout(title=title, xaxis_title="first layer of the pair", yaxis_title="total H1 persistence (Alpha)",
                      template="plotly_white", height=420)
    layers = flow.get("layers", [])  # x is the position among the captured layers: label it with their numbers
    fig.update_xaxes(tickvals=list(range(len(layers))), ticktext=[str(L) for L in layers])
    return fig


def write_probe_html(report: ProbeReport, path) -> None:
    from workbench.topology.plots import diagram_figure

    model = report.model_name
    sections = [("Per-layer table", html_table(summary_table(report)))]
    for condition, result in report.conditions.items():
        best, layer = result.summary.best_topology_layer, result.best
        sections += [
            (f"{condition}: AUC by layer", auc_figure(result, f"{model} / {condition}: clean vs {result.adversarial_label}")),
            (f"{condition}: compression signature by layer", signature_figure(result, "signature features")),
            (f"{condition}: effect sizes", effect_heatmap(result, "all summary features")),
        ]
        for name, pairs in layer.example_diagrams.items():
            sections.append((f"{condition}: layer {best}, one {name} subsample (k={layer.k})",
                             diagram_figure(diagrams_from_lists(pairs), f"{name}, layer {best}")))
        sections.append((f"{condition}: Betti curves at layer {best}", betti_figure(layer, "H1 Betti curves")))
        if result.neuron_flow:
            sections.append((f"{condition}: neuron-level flow", flow_figure(result.neuron_flow, "neuron-pair clouds")))
        moved = "".join(f"<li>{s}</li>" for s in layer.moved[:15]) or "<li>none at q &lt; 0.05</li>"
        sections.append((f"{condition}: what moved at layer {best}", f"<ul>{moved}</ul>"))
    intro = (f"Model <b>{model}</b>; seed {report.config.seed}; versions "
             + ", ".join(f"{k} {v}" for k, v in report.versions.items()))
    write_html(path, f"workbench probe: {model}", sections, intro)
