"""Progress bars that a program can follow too.

Every long loop in the workbench shows a tqdm bar through ``progress_bar``. A front-end that runs a
command in another process (the app's background probe) asks for ``--progress-file PATH``: while
``reporting(PATH)`` is active, every bar that draws also writes its state there as one small JSON
object (``desc``, ``n``, ``total``, ``unit``, ``stage`` = the first word of ``desc``), replaced
atomically, so the reader never parses terminal output and never sees half a record.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import time
from pathlib import Path

from tqdm.auto import tqdm

_SINK: contextvars.ContextVar[Path | None] = contextvars.ContextVar("workbench_progress_file", default=None)
MIN_INTERVAL_S = 0.25  # between two writes of the progress file (the last state of a bar is always written)


class _Bar(tqdm):
    """A tqdm bar that also reports to the active progress file whenever it redraws."""

    _last_write = 0.0

    def display(self, msg=None, pos=None):
        shown = super().display(msg, pos)
        sink = _SINK.get()
        now = time.monotonic()
        if sink is not None and (now - self._last_write >= MIN_INTERVAL_S or self.n == self.total):
            self._last_write = now
            _write(sink, self.format_dict)
        return shown

    def close(self):
        sink = _SINK.get()
        if sink is not None and not self.disable:
            _write(sink, self.format_dict)
        super().close()


def _write(sink: Path, state: dict) -> None:
    from workbench.io import write_text_atomic

    desc = (state.get("prefix") or "").strip()
    record = {"stage": desc.split(" ")[0] if desc else "", "desc": desc, "n": state.get("n", 0),
              "total": state.get("total"), "unit": state.get("unit", "it"), "elapsed_s": round(state.get("elapsed", 0), 2)}
    with contextlib.suppress(OSError):  # progress is advisory: a full disk never stops the work
        write_text_atomic(sink, json.dumps(record))


def progress_bar(iterable=None, **kwargs) -> tqdm:
    """``tqdm(iterable, **kwargs)``, reporting to the progress file when one is active. ``TQDM_DISABLE`` (1, true,
    yes, on) silences every bar, also one a caller enabled with ``disable=not progress`` (tqdm itself reads the
    variable once at import, and an explicit ``disable=False`` would override it)."""
    if os.environ.get("TQDM_DISABLE", "").strip().lower() in ("1", "true", "yes", "on"):
        kwargs["disable"] = True
    return _Bar(iterable, **kwargs)


@contextlib.contextmanager
def reporting(path: str | Path | None):
    """Bars opened inside the block write their state to ``path`` (nothing when ``path`` is None)."""
    if path is None:
        yield
        return
    token = _SINK.set(Path(path))
    try:
        yield
    finally:
        _SINK.reset(token)


def report_to(path: str | Path | None) -> None:
    """For the rest of this process (the CLI's ``--progress-file``): bars write their state to ``path``."""
    from workbench.errors import WorkbenchError

    if path is not None and Path(path).is_dir():
        raise WorkbenchError(f"--progress-file {path} is a folder: give a file path")
    _SINK.set(Path(path) if path is not None else None)


def read_progress(path: str | Path) -> dict | None:
    """The last state written to a progress file, or None if there is none (yet)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
