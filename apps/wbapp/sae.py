"""SAEs for the Features page and the playground: where they are, loading them once, their feature records.

An SAE is a SAELens folder (``cfg.json`` + ``sae_weights.safetensors``); its feature descriptions
(``workbench.sae.features.describe_features`` records) are read from ``features.json`` beside it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import streamlit as st

from wbapp.access import env_folders
from wbapp.runs import REPO
from workbench.errors import WorkbenchError
from workbench.sae.train import FEATURES_FILE  # where `workbench sae features` writes (no SAELens import)

TRAIN = "workbench sae train --model {model} && workbench sae features {model}-L12-resid_post-topk --model {model}"
DESCRIBE = "workbench sae features {sae} --model {model}"


def has_module(name: str) -> bool:
    """Whether ``workbench.sae.<name>`` exists in this checkout."""
    try:
        return importlib.util.find_spec(f"workbench.sae.{name}") is not None
    except ModuleNotFoundError:
        return False


def search_roots() -> list[Path]:
    """Our trained SAEs (user cache), the studies' results, and ``$WORKBENCH_APP_SAES``."""
    from workbench.paths import cache_dir

    return [cache_dir("saes"), REPO / "studies", *env_folders("WORKBENCH_APP_SAES")]


def find_saes(roots: list[Path] | None = None) -> list[Path]:
    """SAE folders in SAELens format under the roots (training checkpoints left out)."""
    found = set()
    for root in roots if roots is not None else search_roots():
        if root.is_dir():
            found |= {p.parent.resolve() for p in root.rglob("sae_weights.safetensors")
                      if (p.parent / "cfg.json").exists() and "checkpoints" not in p.parts}
    return sorted(found)


@st.cache_resource(show_spinner="loading the SAE...", max_entries=4)
def get_sae(path: str):
    from workbench.sae.load import load_sae

    return load_sae(path)


def sae_model(path: str | Path) -> str:
    """The model an SAE we trained belongs to (from its workbench.json), for the commands we suggest."""
    try:
        return json.loads((Path(path) / "workbench.json").read_text())["config"]["model_name"]
    except (OSError, ValueError, KeyError):
        return "MODEL"


def feature_records(path: str | Path) -> dict[int, dict]:
    """``{feature: record}`` from the SAE folder's features.json; a one-line error says how to make it."""
    file = Path(path) / FEATURES_FILE
    if not file.is_file():
        raise WorkbenchError(f"{path} has no feature descriptions: run "
                             f"`{DESCRIBE.format(sae=path, model=sae_model(path))}`")
    return _records(str(file), file.stat().st_mtime_ns)


@st.cache_data(max_entries=4, show_spinner=False)
def _records(file: str, mtime_ns: int) -> dict[int, dict]:
    from workbench.sae.features import records_by_feature

    try:
        return records_by_feature(json.loads(Path(file).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WorkbenchError(f"{file} is not a list of feature records ({exc}); re-run `workbench sae features`") from None


def sae_status(model: str, what: str = "this view") -> tuple[str, str]:
    """(what is missing, the command that provides it) for an SAE-based view."""
    if not has_module("interventions"):
        return (f"{what} needs the SAE analyzer (`workbench.sae`), which this checkout does not have. "
                "Update it, then", TRAIN.format(model=model))
    undescribed = [p for p in find_saes() if not (p / FEATURES_FILE).exists()]
    if undescribed:
        return (f"{what} needs feature descriptions; {len(undescribed)} SAE(s) have none yet.",
                DESCRIBE.format(sae=undescribed[0], model=sae_model(undescribed[0])))
    return f"{what} needs a trained SAE with feature descriptions; none found.", TRAIN.format(model=model)


def sae_picker(key: str, model) -> tuple[object, dict] | None:
    """Choose an SAE that fits ``model`` and has feature records; ``None`` (with what to run) when there is none."""
    saes = [p for p in find_saes() if (p / FEATURES_FILE).exists()] if has_module("interventions") else []
    if not saes:
        from wbapp.ui import missing

        missing(*sae_status(model.cfg.model_name, "This locus"))
        return None
    path = st.selectbox("SAE", [str(p) for p in saes], key=key, format_func=lambda p: f"{Path(p).name}  ·  {p}")
    sae = get_sae(path)
    from workbench.sae.train import check_site_matches

    check_site_matches(model, sae)
    return sae, feature_records(path)
