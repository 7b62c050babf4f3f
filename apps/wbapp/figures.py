"""Composition of the library's figures for the app (the figures themselves come from workbench)."""

from __future__ import annotations

import numpy as np


def overlay_diagrams(figures: dict, title: str):
    """Several ``diagram_figure``s in one: later classes get open markers, dashed bars stacked below.

    Reuses the library's traces as they are; only their look and the barcode rows change.
    """
    names = list(figures)
    base = figures[names[0]]
    for trace in base.data:
        if trace.name:
            trace.name = f"{names[0]}: {trace.name}"
    offset = _barcode_rows(base)
    for name in names[1:]:
        for trace in figures[name].data:
            if trace.xaxis == "x2":  # barcode: stack below the previous class
                trace.y = np.asarray(trace.y, dtype=float) + offset
                trace.line.dash = "dash"
                trace.legendgroup = f"{name}-{trace.legendgroup}"
            elif trace.mode == "markers":
                trace.marker.symbol = tuple(f"{s}-open" for s in trace.marker.symbol)
                trace.name = f"{name}: {trace.name}"
                trace.legendgroup = f"{name}-{trace.legendgroup}"
            else:
                continue  # the diagonal is already there
            base.add_trace(trace)
        offset += _barcode_rows(figures[name])
    base.update_layout(title=title)
    return base


def _barcode_rows(fig) -> float:
    ys = [np.asarray(t.y, dtype=float) for t in fig.data if t.xaxis == "x2" and len(t.y)]
    return float(np.nanmax(np.concatenate(ys))) + 3 if ys else 0.0
