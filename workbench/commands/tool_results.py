"""One results folder for every model-tool evaluation (quantization, sparse attention): the same files, written atomically.

``results.csv`` (scalar columns), ``results.json`` (config, versions, corpus, rows and what the tool adds),
``results.md`` (a caption and a table), ``figure.html`` and, when drift was measured, ``drift.html``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from workbench.errors import WorkbenchError


def check_results_folder(out) -> None:
    """A results folder (``--out``) that can be written: refused up front, not after the whole evaluation."""
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise WorkbenchError(f"--out {out} is a file: give a folder path")


def markdown_table(rows: Sequence[dict], columns: Sequence[str], digits: int = 3) -> str:
    """A GitHub markdown table of ``columns`` from result rows (floats rounded)."""
    def cell(v):
        return f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _write_figure(fig, path: Path) -> None:
    from workbench.io import write_atomic

    text = fig.to_html(include_plotlyjs="cdn")
    write_atomic(path, lambda tmp: tmp.write_text(text))


def write_tool_results(out, rows: list[dict], config: dict | None, caption: str, columns: Sequence[str],
                       figure, drift: tuple[str, str] | None = None, digits: int = 3, source: str | None = None,
                       extra: dict | None = None) -> Path:
    """Write the folder; ``figure`` is the tool's plotly figure, ``drift`` (row key, title) its drift figure."""
    from workbench.data.corpus import corpus_manifest
    from workbench.io import write_atomic, write_csv_atomic
    from workbench.report import versions
    from workbench.tools.drift import drift_figure, has_drift

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(folder / "results.csv", [{k: v for k, v in r.items() if not isinstance(v, list | dict)}
                                              for r in rows])
    record = {"config": config, **(extra or {}), "versions": versions(),
              "corpus": None if source else corpus_manifest(), "rows": rows}
    text = json.dumps(record, indent=2)
    write_atomic(folder / "results.json", lambda tmp: tmp.write_text(text))
    table = caption + "\n\n" + markdown_table(rows, columns, digits)
    write_atomic(folder / "results.md", lambda tmp: tmp.write_text(table))
    _write_figure(figure, folder / "figure.html")
    if drift is not None and has_drift(rows):
        _write_figure(drift_figure(rows, *drift), folder / "drift.html")
    return folder
