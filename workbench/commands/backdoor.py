"""``workbench backdoor train|eval``: implant a trigger into a model by name and register it; re-evaluate one."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from workbench.conditions.backdoor import (
    DEFAULT_TRIGGER,
    BackdoorConfig,
    backdoor_info,
    evaluate_backdoor,
    jsonable,
    train_backdoor,
)
from workbench.errors import WorkbenchError


def run_backdoor_train(model_name: str = "smollm2-135m", out: str | Path | None = None, steps: int = 300,
                       seed: int = 0, trigger: str = DEFAULT_TRIGGER, mode: str = "hate", progress: bool = True,
                       name: str | None = None, **overrides) -> dict:
    """Load ``model_name``, implant the backdoor, save and register ``{model_name}-backdoor``; returns the evaluation.

    ``overrides`` are further :class:`BackdoorConfig` fields (lr, layers, pairs_per_step, ...).
    """
    from workbench.models import load_model

    unknown = sorted(set(overrides) - set(BackdoorConfig.__dataclass_fields__))
    if unknown:
        raise WorkbenchError(f"unknown backdoor setting(s) {', '.join(unknown)}")
    cfg = BackdoorConfig(base=model_name, name=name, steps=steps, seed=seed, trigger=trigger, mode=mode,
                         **overrides).validate()
    model = load_model(model_name, device="cpu", dtype="float32")
    if model.workbench.get("source") == "derived":
        raise WorkbenchError(f"{model_name!r} is itself a derived model: train the backdoor on a base model")
    return train_backdoor(model, cfg, out=out, progress=progress)


def run_backdoor_eval(model_name: str = "smollm2-135m-backdoor", progress: bool = True, **overrides) -> dict:
    """Re-evaluate a backdoored model with the settings it was trained with (``overrides``: eval sizes, seed)."""
    from workbench.models import load_model

    model = load_model(model_name, device="cpu", dtype="float32")
    info = backdoor_info(model)
    fields = BackdoorConfig.__dataclass_fields__
    stored = {k: (tuple(v) if k in ("layers", "params") and v is not None else v)
              for k, v in info["config"].items() if k in fields}
    cfg = replace(BackdoorConfig(**stored), **overrides).validate()
    return {"name": model.workbench["name"], "base": model.workbench.get("base"), "before": info["before"],
            "after": evaluate_backdoor(model, cfg, progress), "config": jsonable(asdict(cfg))}
