"""Which folders the app may read and write: a typed path or a ``?run=`` link never reaches past them.

The roots are the user cache (``$WORKBENCH_CACHE``), the repository's ``studies/``, the app's own
``examples/`` (a committed report, so a fresh install has a run to show), the folders the app
was started with (``streamlit run apps/main.py -- --allow DIR``) and those named by the environment
variables that point the app at data (``$WORKBENCH_APP_RUN``, ``$WORKBENCH_APP_RUNS``,
``$WORKBENCH_APP_SAES``): all chosen by whoever starts the app, none by a visitor.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from workbench.errors import WorkbenchError

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"  # apps/examples, shipped inside the package too
ENV_FOLDERS = ("WORKBENCH_APP_RUN", "WORKBENCH_APP_RUNS", "WORKBENCH_APP_SAES")


def allowed_path(path: str | Path, roots: list[Path]) -> Path:
    """``path`` with ``~``, ``..`` and symlinks resolved, if that lies inside one of ``roots``; else a one-line error."""
    try:
        resolved = Path(path).expanduser().resolve()
        real = [Path(root).expanduser().resolve() for root in roots]
    except (OSError, RuntimeError, ValueError) as exc:  # a NUL byte, a symlink loop, an unknown ~user
        raise WorkbenchError(f"{str(path)!r} is not a usable path ({exc})") from None
    if any(resolved.is_relative_to(root) for root in real):
        return resolved
    shown = ", ".join(dict.fromkeys(map(str, real))) or "none"
    raise WorkbenchError(f"{path} is outside the folders this app may open ({shown}): choose one there, "
                         "or restart the app with `streamlit run apps/main.py -- --allow FOLDER`")


def env_folders(name: str) -> list[Path]:
    """The folders in ``$name`` (``os.pathsep``-separated)."""
    return [Path(p).expanduser() for p in os.environ.get(name, "").split(os.pathsep) if p.strip()]


def argv_folders(argv: list[str]) -> list[Path]:
    """Folders given as ``--allow DIR`` or ``--allow=DIR`` among the script's arguments (after ``--``)."""
    found, args = [], iter(argv)
    for arg in args:
        if arg == "--allow":
            found.append(next(args, ""))
        elif arg.startswith("--allow="):
            found.append(arg.split("=", 1)[1])
    return [Path(p).expanduser() for p in found if p.strip()]


def app_roots() -> list[Path]:
    """Every root the app may use now (see the module docstring)."""
    from workbench.paths import cache_dir

    roots = [cache_dir(), REPO / "studies", EXAMPLES, *argv_folders(sys.argv[1:])]
    return roots + [p for name in ENV_FOLDERS for p in env_folders(name)]


def checked(path: str | Path) -> Path:
    """``path`` resolved, if the app may use it; the error names the allowed roots."""
    return allowed_path(path, app_roots())
