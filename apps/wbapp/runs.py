"""Probe report folders: where to find them, which one is selected, and the background quick probe.

A run is any folder holding a ``report.json`` written by ``workbench probe`` (or a study that calls it).
The selection lives in the session; ``?run=PATH`` or ``$WORKBENCH_APP_RUN`` seeds it, so a test or a
link can open the app on a given folder. Every folder read or written goes through ``access.checked``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from wbapp.access import EXAMPLES, REPO, checked, env_folders
from workbench.errors import WorkbenchError
from workbench.probe import ProbeReport

RUN_KEY = "run_dir"


def search_roots() -> list[Path]:
    """The user cache's ``runs/`` (the CLI's default), the repo's study results, the app's committed example, and
    ``$WORKBENCH_APP_RUNS``."""
    from workbench.paths import cache_dir

    return [cache_dir("runs"), REPO / "studies", EXAMPLES, *env_folders("WORKBENCH_APP_RUNS")]


def discover_runs(roots: list[Path] | None = None) -> list[Path]:
    """Folders with a report.json under the roots (at most four levels down), newest first."""
    found = set()
    for root in roots if roots is not None else search_roots():
        if not root.is_dir():
            continue
        for depth in range(5):
            found.update(p.parent.resolve() for p in root.glob("/".join(["*"] * depth + ["report.json"])))
    return sorted(found, key=lambda p: (p / "report.json").stat().st_mtime, reverse=True)


def load_report(folder: str | Path) -> ProbeReport:
    """The typed report of a run folder (cached on its modification time), if the app may read it."""
    path = checked(folder)
    report = path / "report.json" if path.is_dir() else path
    if not report.is_file():
        raise WorkbenchError(f"no report.json in {path}: pick a folder written by `workbench probe`")
    return _parse(str(report), report.stat().st_mtime_ns)


@st.cache_resource(max_entries=8, show_spinner=False)
def _parse(path: str, mtime_ns: int) -> ProbeReport:
    """One parse per file version, shared read-only by every session (the record is never mutated)."""
    from workbench.probe import load_report as read

    return read(path)


def current_run() -> Path | None:
    """The selected run: the session's choice, else ``?run=``, ``$WORKBENCH_APP_RUN``, the newest found.

    A ``?run=`` outside the allowed folders is refused with one red line (and nothing selected).
    """
    if st.session_state.get(RUN_KEY):
        return Path(st.session_state[RUN_KEY])
    seeded = st.query_params.get("run") or os.environ.get("WORKBENCH_APP_RUN")
    if not seeded:
        runs = discover_runs()
        seeded = str(runs[0]) if runs else None
    if seeded:
        try:
            select_run(seeded)
        except WorkbenchError as exc:
            st.error(str(exc))
            return None
        return Path(st.session_state[RUN_KEY])
    return None


def select_run(folder: str | Path) -> None:
    """Make ``folder`` the session's run, if the app may read it (else a WorkbenchError)."""
    st.session_state[RUN_KEY] = str(checked(folder))


# ----------------------------------------------------------------------------- the quick probe job

# the progress bars of `workbench probe`, in order, and the share of the job each ends at
STAGES = (("capture", 0.45), ("topology", 0.95))
PROGRESS_FILE = "app-progress.json"  # the probe's --progress-file, in its output folder


@dataclass
class ProbeJob:
    """``workbench probe --quick`` in a child process, so the page stays live and the job can be cancelled."""

    out: Path
    args: list[str]
    proc: subprocess.Popen = field(repr=False)
    started: float = field(default_factory=time.time)

    @classmethod
    def start(cls, model: str, out: str | Path, pairs: int | None = None, layers: str | None = None) -> ProbeJob:
        out = checked(out)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file in the way, no permission
            raise WorkbenchError(f"cannot use {out} as the output folder ({exc.strerror}): choose another") from None
        (out / PROGRESS_FILE).unlink(missing_ok=True)  # a previous job's last state is not this one's
        args = ["--progress-file", str(out / PROGRESS_FILE),
                "probe", "--quick", "--model", model, "--out", str(out), "--overwrite"]  # other settings are replaced
        args += ["--pairs", str(pairs)] if pairs else []
        args += ["--layers", layers] if layers else []
        log = (out / "app-probe.log").open("w")
        proc = subprocess.Popen([sys.executable, "-c", "from workbench.cli import main; main()", *args],
                                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        log.close()
        return cls(out=out, args=args, proc=proc)

    @property
    def log_text(self) -> str:
        path = self.out / "app-probe.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def progress(self) -> tuple[float, str]:
        """Fraction done and a label, from the state the probe's progress bars write (``--progress-file``)."""
        from workbench.progress import read_progress

        if self.proc.poll() == 0:
            return 1.0, "done"
        state = read_progress(self.out / PROGRESS_FILE)
        ends = dict(STAGES)
        if state is None or state["stage"] not in ends:
            return 0.02, "loading the model"
        stage, share = state["stage"], state["n"] / state["total"] if state.get("total") else 0.0
        start = 0.05 if stage == STAGES[0][0] else STAGES[0][1]
        return start + (ends[stage] - start) * share, f"{state['desc']}: {state['n']}/{state['total']} {state['unit']}"

    def error_line(self) -> str:
        """The CLI's one-line error (``error: ...``) or the last line of its output."""
        lines = [line for line in re.split(r"[\r\n]+", self.log_text) if line.strip()]
        errors = [line for line in lines if line.startswith("error:")]
        return (errors or lines or ["the probe stopped without output"])[-1]

    def cancel(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
