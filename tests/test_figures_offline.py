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
