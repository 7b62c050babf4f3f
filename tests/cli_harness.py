"""Run the ``workbench`` command in-process as a user would, and check how it refuses bad input.

``run_cli`` goes through ``workbench.cli.main`` (the console entry point), so the one-line error
conversion is what is tested, not typer's test runner. ``assert_refused`` is the contract every
bad input must meet: exit code 2, one line on stderr starting with ``error:``, no traceback, and
nothing written or changed under the folders it watches.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``workbench *argv`` run in this process."""
    from workbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def snapshot(*folders: str | Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folders`` with its size and modification time: what 'nothing written' compares."""
    files = {}
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                path = Path(root) / name
                with contextlib.suppress(FileNotFoundError):
                    stat = path.stat()
                    files[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return files


def assert_refused(argv: list[str], expect: str = "", watch: tuple[str | Path, ...] = ()) -> str:
    """``argv`` fails as a user error should; returns the message. ``expect`` must appear in it."""
    before = snapshot(*watch)
    code, out, err = run_cli(argv)
    message = err.strip()
    assert "Traceback" not in err and "Traceback" not in out, f"{argv}: traceback\n{err}"
    assert code == 2, f"{argv}: exit {code}, stderr {err!r}, stdout {out[-500:]!r}"
    if message.startswith("Usage:"):  # typer's own usage error (a value of the wrong type): its boxed message
        line = " ".join(message.replace("│", " ").split())
    else:
        lines = [ln for ln in message.splitlines() if ln.strip() and not ln.startswith(("WARNING", "INFO"))]
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{argv}: not one error line: {message!r}"
        line = lines[0]
    assert expect.lower() in line.lower(), f"{argv}: {line!r} does not say {expect!r}"
    assert snapshot(*watch) == before, f"{argv}: a refused run wrote or changed files"
    return line
