"""What the SAE pages need from the SAE analyzer (``workbench.sae``), and what to run when it is missing."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from wbapp.runs import REPO

TRAIN = "workbench sae train --model {model}"


def has_module(name: str) -> bool:
    """Whether ``workbench.sae.<name>`` exists in this checkout (the analyzer lands module by module)."""
    try:
        return importlib.util.find_spec(f"workbench.sae.{name}") is not None
    except ModuleNotFoundError:
        return False


def find_saes(roots: list[Path] | None = None) -> list[Path]:
    """SAE folders in SAELens format (cfg.json + sae_weights.safetensors) under the default places."""
    if roots is None:
        from workbench.paths import cache_dir

        roots = [cache_dir("saes"), REPO / "studies"]
        roots += [Path(p) for p in os.environ.get("WORKBENCH_APP_SAES", "").split(os.pathsep) if p]
    found = {p.parent.resolve() for root in roots if root.is_dir() for p in root.rglob("sae_weights.safetensors")
             if (p.parent / "cfg.json").exists() and "checkpoints" not in p.parts}
    return sorted(found)


def sae_status(model: str, locus: str = "feature") -> tuple[str, str]:
    """(what is missing, the command that provides it) for an SAE-based view."""
    if not (has_module("features") and has_module("interventions")):
        return (f"The {locus} view needs the SAE analyzer (`workbench.sae.features`, `.interventions`), "
                "which this checkout does not have yet. Update the checkout, then", TRAIN.format(model=model))
    return f"No SAE trained for {model} yet.", TRAIN.format(model=model)
