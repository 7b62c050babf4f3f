"""Where regenerable artefacts live (dequantized weights, stores, SAEs).

Never inside the repository: a user cache folder, overridable by ``WORKBENCH_CACHE``.
"""

import os
from pathlib import Path

from workbench.errors import WorkbenchError


def safe_name(name, what: str = "name") -> str:
    """``name`` if it is one plain path segment, else a one-line error: a name that becomes a folder
    (a study, an SAE, a derived model) must not reach outside its parent (``..``, ``/``, ``\\``) or be empty."""
    if not isinstance(name, str):
        raise WorkbenchError(f"{what} {name!r} must be text (a plain folder name such as 'my-run')")
    problems = (
        (not name.strip(), "is empty"),
        (name in (".", ".."), "is a dot segment"),
        (any(c in name for c in "/\\\0"), "contains a path separator"),
        (len(name.encode()) > 200, "is longer than 200 bytes"),
    )
    for failed, problem in problems:
        if failed:
            raise WorkbenchError(f"{what} {name!r} {problem}: use a plain folder name such as 'my-run' "
                                 "(letters, digits, '-', '_', '.')")
    return name


def model_folder_name(name: str) -> str:
    """A model name as one folder-name segment: a Hugging Face id ``org/name`` becomes ``org--name``."""
    return safe_name(str(name).replace("/", "--").replace("\\", "--"), "model name")


def cache_root() -> Path:
    """``$WORKBENCH_CACHE``, else the platform's user cache folder for workbench (platformdirs: on Linux
    ``$XDG_CACHE_HOME/workbench``, by default ``~/.cache/workbench``)."""
    from platformdirs import user_cache_dir

    return Path(os.environ.get("WORKBENCH_CACHE") or user_cache_dir("workbench", appauthor=False))


def cache_dir(*parts: str) -> Path:
    """The user cache folder (``cache_root``) or a folder in it, created on demand.

    Each part is one plain name (see ``safe_name``), so no part can point outside the cache.
    """
    root = cache_root()
    path = root.joinpath(*(safe_name(part, "cache folder name") for part in parts))
    path.mkdir(parents=True, exist_ok=True)
    return path
