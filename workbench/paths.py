"""Where regenerable artefacts live (dequantized weights, stores, SAEs).

Never inside the repository: a user cache folder, overridable by ``WORKBENCH_CACHE``.
"""

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The user cache folder (``$WORKBENCH_CACHE`` or ``~/.cache/workbench``), created on demand."""
    root = Path(os.environ.get("WORKBENCH_CACHE") or Path.home() / ".cache" / "workbench")
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
