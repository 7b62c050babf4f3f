"""Every figure the workbench writes, or the repository holds, opens without a network."""

import re
from pathlib import Path

import plotly.graph_objects as go

from workbench.report import write_figure, write_html

REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc\s*=\s*[\"']?(https?:)?//", re.IGNORECASE)
ROOT = Path(__file__).resolve().parents[1]


def test_the_figure_writers_embed_plotly(tmp_path):
    fig = go.Figure(go.Scatter(x=[0, 1], y=[1, 0]))
    for page in (write_figure(tmp_path / "f.html", fig), write_html(tmp_path / "r.html", "t", [("a", fig), ("b", fig)])):
        text = page.read_text()
        assert not REMOTE_SCRIPT.search(text), page
        assert text.count("Plotly.newPlot") >= 1 and len(text) > 1_000_000  # plotly.js itself is in the page
    assert REMOTE_SCRIPT.search('<script src="https://cdn.plot.ly/plotly-3.0.1.min.js"></script>')  # the check bites


def test_no_html_in_the_repository_loads_a_remote_script():
    pages = [p for p in ROOT.rglob("*.html") if not {".venv", "node_modules", ".git"} & set(p.parts)]
    assert not [str(p) for p in pages if REMOTE_SCRIPT.search(p.read_text(errors="replace"))]


def test_sixteen_settings_get_sixteen_colours_and_no_fixed_width():
    from workbench.tools.drift import drift_figure
    from workbench.tools.quant_eval import quant_figure

    rows = [{"setting": f"s{i}", "ppl": 10.0 + i, "ppl_window_end": 11.0 + i, "drift_tokens_per_layer": [0.1, 0.2 + i],
             "ph_layers": [0, 1], "ph_bottleneck_h0_per_layer": [0.1, 0.2], "ph_bottleneck_h1_per_layer": [0.0, 0.1]}
            for i in range(16)]
    for fig in (quant_figure(rows), drift_figure(rows, "setting", "drift")):
        lines = [t for t in fig.data if t.type == "scatter"]
        assert len({t.line.color for t in lines}) == 16  # H0 and H1 of one setting share its colour
        assert fig.layout.width is None and fig.layout.legend.orientation == "h"
