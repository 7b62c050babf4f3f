"""Reports shared by the CLI, the app and the studies: self-contained HTML pages of plotly figures, JSON.

An HTML report embeds plotly.js once, inline, so it opens offline; JSON goes through
``write_json_atomic`` so a crash never leaves half a report.
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
import platform
from pathlib import Path

from workbench.io import write_json_atomic, write_text_atomic


@functools.cache
def source_sha256() -> str:
    """Fingerprint of the workbench's own code (every .py file of the package and its kernels): an edited
    analysis is another version even when the package's version string stays the same."""
    import importlib.util

    import workbench

    roots = [Path(workbench.__file__).parent]
    kernels = importlib.util.find_spec("workbench.kernels")
    roots += [Path(p) for p in (kernels.submodule_search_locations or [])] if kernels is not None else []
    return tree_sha256(roots)


def tree_sha256(roots) -> str:
    """sha256 (16 hex digits) of the names and contents of every .py file under ``roots``."""
    digest = hashlib.sha256()
    for root in dict.fromkeys(Path(r).resolve() for r in roots):
        for file in sorted(root.rglob("*.py")):
            digest.update(f"{file.relative_to(root)}\0{len(file.read_bytes())}\0".encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def versions() -> dict:
    """Versions of the packages (and the platform) the numbers depend on, the workbench's own code by its
    fingerprint: recorded beside every result, and part of every study job's cache key (a code edit recomputes
    the jobs), so nothing here may depend on what happens to be imported. The text corpus is recorded by its
    key and distributions: the generator's documents and every corpus-token measurement depend on it."""
    from importlib.metadata import PackageNotFoundError, version

    from workbench.data.corpus import corpus_record

    out = {"python": platform.python_version(), "platform": platform.platform(), "workbench_source": source_sha256(),
           "corpus": corpus_record()}
    for pkg in ("workbench", "torch", "transformer-lens", "transformers", "numpy", "scikit-learn", "giotto-ph",
                "ripser", "gudhi", "sae-lens"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            continue
    return out


def write_figure(path: str | Path, figure) -> Path:
    """One plotly figure as a standalone page with plotly.js embedded, written atomically: it opens offline
    (a CDN script renders a blank page without a network)."""
    write_text_atomic(Path(path), figure.to_html(include_plotlyjs=True, full_html=True))
    return Path(path)


def setting_colours(names) -> dict[str, str]:
    """One distinct colour per setting, for up to 24 (then they repeat): plotly's default ten ran out at 16."""
    from plotly.colors import qualitative

    palette = qualitative.Dark24
    return {name: palette[i % len(palette)] for i, name in enumerate(dict.fromkeys(names))}


def readable_layout(fig, title: str, height: int):
    """The width of the page or app column (no fixed width that cuts it off), the legend under the plots, and
    slanted category labels that keep their room."""
    fig.update_layout(title=title, barmode="group", height=height, autosize=True, template="plotly_white",
                      legend={"orientation": "h", "yanchor": "top", "y": -0.28, "xanchor": "left", "x": 0},
                      margin={"b": 170})
    fig.update_xaxes(tickangle=-40, automargin=True)
    fig.update_yaxes(automargin=True)
    return fig


def write_html(path: str | Path, title: str, sections: list[tuple[str, object]], intro: str = "") -> Path:
    """One page: a title, an intro paragraph, then (heading, plotly figure or HTML string) sections."""
    path = Path(path)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
             "</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
    if intro:
        parts.append(f"<p>{intro}</p>")
    first = True
    for heading, body in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        if hasattr(body, "to_html"):
            parts.append(body.to_html(full_html=False, include_plotlyjs=first))  # embedded once, offline
            first = False
        else:
            parts.append(str(body))
    parts.append("</body></html>")
    write_text_atomic(path, "\n".join(parts))
    return path


def html_table(rows: list[dict], columns: list[str] | None = None, digits: int = 3) -> str:
    """A small HTML table from a list of dicts."""
    if not rows:
        return "<p>(empty)</p>"
    columns = columns or list(rows[0])

    def cell(v):
        if isinstance(v, float):
            return f"{v:.{digits}g}"
        return html.escape(json.dumps(v) if isinstance(v, (list, dict)) else str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


__all__ = ["html_table", "readable_layout", "setting_colours", "versions", "write_figure", "write_html",
           "write_json_atomic"]
