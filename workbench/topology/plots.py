"""Plotly figures of persistence diagrams and barcodes (shared by the CLI, reports and the app)."""

from __future__ import annotations

import numpy as np

from workbench.topology.summaries import diagrams_of

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def diagram_figure(result, title: str = ""):
    """Persistence diagram (left) and barcode (right) of one sample; infinite bars drawn at the top edge."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    dgms = diagrams_of(result)
    finite = np.concatenate([d[np.isfinite(d[:, 1])] for d in dgms]) if dgms else np.empty((0, 2))
    top = float(finite[:, 1].max()) if len(finite) else 1.0
    top = top if top > 0 else 1.0
    cap = top * 1.08  # where infinite deaths are drawn
    fig = make_subplots(rows=1, cols=2, subplot_titles=("diagram", "barcode"), column_widths=[0.45, 0.55])
    row = 0
    for dim, d in enumerate(dgms):
        colour = _COLOURS[dim % len(_COLOURS)]
        inf = ~np.isfinite(d[:, 1])
        death = np.where(inf, cap, d[:, 1])
        label = f"H{dim} ({len(d)} bars, {int(inf.sum())} infinite)"
        fig.add_trace(
            go.Scatter(
                x=d[:, 0], y=death, mode="markers", name=label, legendgroup=f"h{dim}",
                marker={"color": colour, "size": 6, "symbol": np.where(inf, "triangle-up", "circle").tolist()},
                hovertemplate="birth %{x:.4g}<br>death %{y:.4g}<extra>H" + str(dim) + "</extra>",
            ),
            row=1, col=1,
        )  # fmt: skip
        order = np.argsort(d[:, 0] - death)  # longest first
        ys = row + np.arange(len(d))
        xs = np.full(3 * len(d), np.nan)
        yy = np.full(3 * len(d), np.nan)
        xs[0::3], xs[1::3] = d[order, 0], death[order]
        yy[0::3], yy[1::3] = ys, ys
        fig.add_trace(
            go.Scatter(x=xs, y=yy, mode="lines", line={"color": colour}, legendgroup=f"h{dim}", showlegend=False),
            row=1, col=2,
        )  # fmt: skip
        row += len(d) + 2
    fig.add_trace(
        go.Scatter(x=[0, cap], y=[0, cap], mode="lines", line={"color": "grey", "dash": "dot"}, showlegend=False),
        row=1, col=1,
    )  # fmt: skip
    fig.update_xaxes(title_text="birth", row=1, col=1)
    fig.update_yaxes(title_text="death (triangles: infinite)", row=1, col=1)
    fig.update_xaxes(title_text="scale", row=1, col=2)
    fig.update_yaxes(showticklabels=False, row=1, col=2)
    fig.update_layout(title=title, template="plotly_white", height=520)
    return fig
