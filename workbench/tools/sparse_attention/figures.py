"""The comparison figure of ``compare_attention`` rows (the CLI's figure.html and the app's study view)."""

from __future__ import annotations

from collections.abc import Sequence


def attention_figure(rows: Sequence[dict], title: str = "Sparse attention"):
    """Plotly figure: loaded fraction, recall and KL per method (left), recall per layer (right)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=("fraction of keys loaded / mass recall",
                                                        "KL(full || sparse) per token", "recall per layer"))
    names = [r["method"] for r in rows]
    fig.add_bar(x=names, y=[r["loaded"] for r in rows], name="loaded", row=1, col=1)
    fig.add_bar(x=names, y=[r["recall"] for r in rows], name="recall", row=1, col=1)
    fig.add_bar(x=names, y=[r["kl"] for r in rows], name="KL", row=1, col=2)
    for r in rows:
        fig.add_scatter(y=r["per_layer"]["recall"], mode="lines", name=r["method"], row=1, col=3)
    fig.update_xaxes(title_text="layer", row=1, col=3)
    fig.update_layout(title=title, barmode="group", height=450, width=1400)
    return fig
