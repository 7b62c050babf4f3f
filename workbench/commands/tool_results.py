"""One results folder for every model-tool evaluation (quantization, sparse attention): the same files, written atomically.

``results.csv`` (scalar columns), ``results.json`` (config, versions, corpus, rows and what the tool adds),
``results.md`` (a caption and a table), ``figure.html`` and, when drift was measured, ``drift.html``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from workbench.io import write_csv_atomic, write_text_atomic


def markdown_table(rows: Sequence[dict], columns: Sequence[str], digits: int = 3) -> str:
    """A GitHub markdown table of ``columns`` from result rows (floats rounded)."""
    def cell(v):
        return f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_tool_results(out, rows: list[dict], config: dict | None, caption: str, columns: Sequence[str],
                       figure, drift: tuple[str, str] | None = None, digits: int = 3, source: str | None = None,
                       extra: dict | None = None) -> Path:
    """Write the folder; ``figure`` is the tool's plotly figure, ``drift`` (row key, title) its drift figure."""
    import torch

    from workbench.data.corpus import corpus_manifest
    from workbench.report import versions, write_figure
    from workbench.tools.drift import drift_figure, has_drift

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(folder / "results.csv", [{k: v for k, v in r.items() if not isinstance(v, list | dict)}
                                              for r in rows])
    # threads change timings (and float sums in the last bits): recorded beside these results, never in a cache key
    record = {"config": config, **(extra or {}), "versions": versions(), "torch_threads": torch.get_num_threads(),
              "corpus": None if source else corpus_manifest(), "rows": rows}
    write_text_atomic(folder / "results.json", json.dumps(record, indent=2))
    write_text_atomic(folder / "results.md", caption + "\n\n" + markdown_table(rows, columns, digits))
    write_figure(folder / "figure.html", figure)
    if drift is not None and has_drift(rows):
        write_figure(folder / "drift.html", drift_figure(rows, *drift))
    return folder
