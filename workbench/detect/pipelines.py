"""Detectors as scikit-learn pipelines over feature arrays, saved as plain JSON (no pickle: loading runs no code).

A ``Detector`` names the feature blocks it reads (``("delta", 15)``: the delta view at layer 15;
``("text", "length")``: a text-only baseline) and holds a fitted ``Pipeline`` (an optional topological
``ReferenceCloudDelta``, standardize, optional PCA, logistic regression). ``to_dict`` writes each step's ``get_params`` and its fitted attributes as lists;
``from_dict`` rebuilds only the classes on the allow-list below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench.detect import shared_fits
from workbench.errors import WorkbenchError

FORMAT = 1
_FITTED = {  # the fitted attributes that make each allowed step usable after loading
    "StandardScaler": ("mean_", "scale_", "var_", "n_features_in_", "n_samples_seen_"),
    "PCA": ("components_", "mean_", "explained_variance_", "explained_variance_ratio_", "singular_values_",
            "n_components_", "n_features_in_", "n_samples_", "noise_variance_"),
    "LogisticRegression": ("coef_", "intercept_", "classes_", "n_features_in_", "n_iter_"),
    "ReferenceCloudDelta": ("reference_", "base_", "n_features_in_"),
    "TokenProbe": ("mean_", "scale_", "direction_", "request_coef_", "request_intercept_", "n_features_in_"),
    "LogitMean": ("center_", "scale_", "classes_", "n_features_in_"),  # and members_, written as nested steps
}


def _classes():
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from workbench.detect.fusion import LogitMean
    from workbench.detect.token_probe import TokenProbe
    from workbench.topology.prompt_views import ReferenceCloudDelta

    return {"StandardScaler": StandardScaler, "PCA": PCA, "LogisticRegression": LogisticRegression,
            "ReferenceCloudDelta": ReferenceCloudDelta, "TokenProbe": TokenProbe, "LogitMean": LogitMean}


def make_pipeline(C: float = 1.0, pca: int | None = None, seed: int = 0, reference: dict | None = None,
                  tokens: dict | None = None, members: list[dict] | None = None, weights: list[float] | None = None):
    """Optionally the change each row makes to a clean reference cloud's barcode (``reference``: its parameters)
    or the injected-token probe's top scores (``tokens``: its parameters), then standardize, optionally project
    on ``pca`` principal components, then a logistic regression. ``members``: instead, a late fusion of such
    pipelines (each its ``columns`` and settings, ``C`` shared), scored by the mean of their standardized logits,
    weighted by ``weights`` (None: equal)."""
    from sklearn.pipeline import Pipeline

    classes = _classes()
    if members is not None:
        if any("columns" not in m for m in members):
            raise WorkbenchError("fused members need their columns: pass the settings through resolve_settings")
        parts = [make_pipeline(C, m.get("pca"), seed, m.get("reference"), m.get("tokens")) for m in members]
        return Pipeline([("fusion", classes["LogitMean"](members=parts, columns=[m["columns"] for m in members],
                                                         weights=None if weights is None else list(weights)))])
    steps = [("reference", classes["ReferenceCloudDelta"](**reference))] if reference is not None else []
    if tokens is not None:
        steps.append(("tokens", classes["TokenProbe"](**tokens)))
    steps.append(("scale", classes["StandardScaler"]()))
    if pca:
        steps.append(("pca", classes["PCA"](n_components=pca, random_state=seed)))
    # liblinear: the same held-out AUCs as lbfgs on these features (within 0.001) in a third of the time
    steps.append(("clf", classes["LogisticRegression"](C=C, solver="liblinear", max_iter=5000)))
    return Pipeline(steps)


def feature_matrix(blocks: list[tuple[str, object]], activations: dict, layers: list[int], text: dict) -> np.ndarray:
    """The columns a detector reads: activation views at layers, and text baselines, side by side."""
    parts = []
    for view, where in blocks:
        if view == "text":
            parts.append(text[where])
        else:
            if where not in layers:
                raise WorkbenchError(f"layer {where} was not captured (have {layers})")
            parts.append(activations[view][:, layers.index(where)])
    return np.concatenate([np.asarray(p, dtype=np.float64).reshape(len(p), -1) for p in parts], axis=1)


def block_widths(blocks: list[tuple[str, object]], activations: dict, text: dict) -> list[int]:
    """How many columns each block gives in ``feature_matrix``."""
    return [int(np.asarray(text[where]).reshape(len(text[where]), -1).shape[1]) if view == "text"
            else int(np.prod(activations[view].shape[2:])) for view, where in blocks]


def resolve_settings(settings: dict, blocks: list[tuple[str, object]], activations: dict, text: dict) -> dict:
    """``settings`` with each fused member's block count (``members: [{"blocks": k, ...}]``, in block order) turned
    into the columns it reads, so a fitted detector needs no feature arrays to know its layout."""
    if "members" not in settings:
        return settings
    edges = np.cumsum([0, *block_widths(blocks, activations, text)])
    counts = [m["blocks"] for m in settings["members"]]
    if sum(counts) != len(blocks):
        raise WorkbenchError(f"fused members read {sum(counts)} blocks, the detector has {len(blocks)}")
    first = np.cumsum([0, *counts])
    members = [{**m, "columns": [int(edges[a]), int(edges[b])]} for m, a, b in zip(settings["members"], first[:-1],
                                                                                   first[1:], strict=True)]
    return {**settings, "members": members}


@dataclass
class Detector:
    """Feature blocks plus a fitted pipeline; ``predict_proba`` gives P(injected) per prompt."""

    name: str
    blocks: list[tuple[str, object]]
    pipeline: object = None
    settings: dict = field(default_factory=dict)  # C, pca, chosen layer: what was selected and how

    def fit(self, X: np.ndarray, y: np.ndarray) -> Detector:
        pipeline = make_pipeline(self.settings.get("C", 1.0), self.settings.get("pca"),
                                 reference=self.settings.get("reference"), tokens=self.settings.get("tokens"),
                                 members=self.settings.get("members"), weights=self.settings.get("weights"))
        self.pipeline = shared_fits.fit(pipeline, X, y)
        return self

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        return self.pipeline.predict_proba(X)[:, 1]

    def to_dict(self) -> dict:
        return {"format": FORMAT, "name": self.name, "blocks": [list(b) for b in self.blocks],
                "settings": self.settings, "steps": _steps_to_list(self.pipeline)}

    @classmethod
    def from_dict(cls, data: dict) -> Detector:
        if data.get("format") != FORMAT:
            raise WorkbenchError(f"detector of format {data.get('format')!r}, this workbench reads {FORMAT}: retrain")
        return cls(name=data["name"], blocks=[tuple(b) for b in data["blocks"]],
                   pipeline=_steps_from_list(data["steps"]), settings=dict(data.get("settings") or {}))


def _steps_to_list(pipeline) -> list[dict]:
    """Each step's class, parameters and fitted attributes (a fusion's fitted members nested as their own steps)."""
    steps = []
    for name, step in pipeline.steps:
        kind = type(step).__name__
        fitted = {a: _jsonable(getattr(step, a)) for a in _FITTED[kind] if hasattr(step, a)}
        params = step.get_params(deep=False)
        entry = {"name": name, "class": kind, "fitted": fitted}
        if kind == "LogitMean":
            params = {"columns": params["columns"], "weights": params["weights"]}
            entry["members"] = [_steps_to_list(m) for m in step.members_]
        steps.append({**entry, "params": _jsonable(params)})
    return steps


def _steps_from_list(steps: list[dict]):
    from sklearn.pipeline import Pipeline

    classes, out = _classes(), []
    for step in steps:
        if step["class"] not in classes:
            raise WorkbenchError(f"detector step {step['class']!r} is not one this workbench loads")
        obj = classes[step["class"]](**step["params"])
        for attr, value in step["fitted"].items():
            setattr(obj, attr, np.asarray(value) if isinstance(value, list) else value)
        if "members" in step:
            obj.members_ = [_steps_from_list(m) for m in step["members"]]
        out.append((step["name"], obj))
    return Pipeline(out)


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value
