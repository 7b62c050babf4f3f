"""A per-prompt injection detector from topology, judged against a linear probe on the same rows.

The reference study classifies whole subsampled clouds; a deployed detector must score one
prompt. Two topological views of a single prompt, both at one layer:

* ``token``: the point cloud of the prompt's own token activations (all positions), its
  Rips barcode summarised by ``BarcodeSummary``: the shape of how the model read it.
* ``reference``: how the prompt's last-token activation changes the barcode of a fixed cloud
  of clean last-token activations (summary with the point minus summary without it): an
  injected prompt that lands far from the clean cloud opens a long H0 bar and may add or kill
  H1 loops.

Each view feeds a standardised logistic regression fitted on the generator's train split;
AUC is measured on its held-out split (unseen attack families and document types) beside a
logistic-regression probe on the raw last-token activations of the same rows. The fitted
detector is plain JSON (no pickle), so loading it can run no code; ``workbench.commands.detect``
trains, saves and loads it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.errors import WorkbenchError

VIEWS = ("token", "reference", "probe")
MIN_PAIRS = 14  # two pairs per attack family: both splits get both classes
REQUIRED = ("config", "model", "weights_sha256", "layer", "d_model", "reference", "views")


def _int(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


@dataclass
class DetectorConfig:
    """How a detector is trained; built, it is valid, so a bad value is refused before anything runs."""

    model: str = "smollm2-135m"
    layer: int | None = None  # None: the middle layer
    n_pairs: int = 300
    reference_size: int = 100  # clean last-token points in the reference cloud
    max_tokens: int = 256  # token clouds are left-truncated to this many tokens
    maxdim: int = 1
    C: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not _int(self.n_pairs, MIN_PAIRS):
            raise WorkbenchError(f"--pairs must be an integer >= {MIN_PAIRS} (both splits need both classes), "
                                 f"got {self.n_pairs!r}")
        if self.layer is not None and not _int(self.layer, -10**6):
            raise WorkbenchError(f"--layer must be an integer, got {self.layer!r}")
        for name, low in (("reference_size", 2), ("max_tokens", 4), ("seed", 0)):
            if not _int(getattr(self, name), low):
                raise WorkbenchError(f"{name} must be an integer >= {low}, got {getattr(self, name)!r}")
        if self.maxdim not in (0, 1, 2):
            raise WorkbenchError(f"maxdim must be 0, 1 or 2, got {self.maxdim!r}")
        if isinstance(self.C, bool) or not isinstance(self.C, (int, float)) or not (math.isfinite(self.C) and self.C > 0):
            raise WorkbenchError(f"C must be a finite number > 0, got {self.C!r}")


def token_features(store, site: str, maxdim: int = 1, progress: bool = True) -> tuple[np.ndarray, list[str]]:
    """Barcode summary of every row's own token cloud (a store captured with positions 'all')."""
    from workbench.progress import progress_bar
    from workbench.topology.persistence import rips_persistence
    from workbench.topology.summaries import BarcodeSummary

    table = store.token_table()
    X = store.get(site, as_numpy=True)
    row_index = table["row_index"].numpy()
    bounds = np.searchsorted(row_index, np.arange(store.n_rows + 1))
    results = []
    for r in progress_bar(range(store.n_rows), desc="token clouds", unit="prompt", disable=not progress):
        cloud = X[bounds[r] : bounds[r + 1]]
        results.append(rips_persistence(cloud[1:] if len(cloud) > 3 else cloud, maxdim=maxdim))  # drop BOS/sink
    summary = BarcodeSummary(dims=tuple(range(maxdim + 1))).fit(results)
    return summary.transform(results), list(summary.get_feature_names_out())


def reference_features(points: np.ndarray, reference: np.ndarray, maxdim: int = 1,
                       progress: bool = True) -> tuple[np.ndarray, list[str]]:
    """Summary(reference + point) - summary(reference) for every point, plus its nearest-neighbour distance."""
    from workbench.progress import progress_bar
    from workbench.topology.persistence import rips_persistence
    from workbench.topology.summaries import BarcodeSummary

    base = rips_persistence(reference, maxdim=maxdim)
    results = [rips_persistence(np.vstack([reference, p[None]]), maxdim=maxdim)
               for p in progress_bar(points, desc="reference cloud", unit="prompt", disable=not progress)]
    summary = BarcodeSummary(dims=tuple(range(maxdim + 1))).fit([base, *results])
    delta = summary.transform(results) - summary.transform([base])
    nn = np.sqrt(((points[:, None, :] - reference[None]) ** 2).sum(-1)).min(1)
    names = [f"delta_{n}" for n in summary.get_feature_names_out()] + ["nn_distance"]
    return np.c_[delta, nn], names


def fit_logistic(X: np.ndarray, y: np.ndarray, C: float = 1.0) -> dict:
    """Standardise + logistic regression, returned as plain numbers."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(X)
    scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)
    clf = LogisticRegression(C=C, max_iter=5000).fit((X - scaler.mean_) / scale, y)
    return {"mean": scaler.mean_.tolist(), "scale": scale.tolist(), "coef": clf.coef_[0].tolist(),
            "intercept": float(clf.intercept_[0])}


def score_logistic(params: dict, X: np.ndarray) -> np.ndarray:
    z = (X - np.asarray(params["mean"])) / np.asarray(params["scale"]) @ np.asarray(params["coef"]) + params["intercept"]
    return 1 / (1 + np.exp(-z))


def model_identity(model) -> dict:
    """What a detector (and its cached captures) depends on in the model: name, weights, dtype, width."""
    info = getattr(model, "workbench", {}) or {}
    return {"model": info.get("name", model.cfg.model_name), "weights_sha256": info.get("weights_sha256"),
            "model_dtype": info.get("dtype", str(model.cfg.dtype)), "d_model": int(model.cfg.d_model)}


def content_key(*parts) -> str:
    """A short hash of JSON-able parts: what names a cache folder after every input of its content."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolve_layer(model, layer: int | None) -> int:
    """``layer`` (None: the middle one; negative counts from the end) as an index of this model, or a one-line error."""
    n = model.cfg.n_layers
    layer = n // 2 if layer is None else layer
    if not -n <= layer < n:
        raise WorkbenchError(f"layer {layer} is out of range: {model.cfg.model_name} has layers 0..{n - 1}")
    return layer % n


def features(model, records: list[dict], layer: int, out: Path, config: DetectorConfig, reference=None,
             progress: bool = True) -> dict:
    """All three views for ``records`` (captures cached under ``out``)."""
    from workbench.capture import capture

    site = f"blocks.{layer}.hook_resid_post"
    last = capture(model, records, [site], out / "last", positions="last", batch_size=8, progress=progress)
    tokens = capture(model, records, [site], out / "tokens", positions="all", batch_size=8,
                     max_tokens=config.max_tokens, progress=progress)
    X_last = last.get(site, as_numpy=True).astype(np.float64)
    X_tok, tok_names = token_features(tokens, site, config.maxdim, progress)
    out_views = {"token": (X_tok, tok_names), "probe": (X_last, [f"resid_{i}" for i in range(X_last.shape[1])])}
    if reference is not None:
        out_views["reference"] = reference_features(X_last, reference, config.maxdim, progress)
    return out_views


def check_detector(model, detector: dict, layer: int | None = None) -> None:
    """The detector was trained on this model (name, weights, width) and, when asked, at this ``layer``."""
    have = model_identity(model)
    asked = detector["layer"] if layer is None else resolve_layer(model, layer)
    same = all(detector.get(k) == have[k] for k in ("model", "weights_sha256", "d_model")) and detector["layer"] == asked
    if not same:
        weights = "" if detector.get("model") != have["model"] or detector.get("weights_sha256") == have[
            "weights_sha256"] else f" with weights {str(detector.get('weights_sha256'))[:12]}"
        raise WorkbenchError(
            f"detector was trained on {detector.get('model')}{weights} layer {detector['layer']} "
            f"(d={detector.get('d_model')}), this is {have['model']} layer {asked} (d={have['d_model']}): "
            "retrain with --train or pass --detector-dir of a detector trained on it")
    if not _int(asked, 0) or asked >= model.cfg.n_layers:
        raise WorkbenchError(f"the detector's layer {asked!r} is not a layer of {have['model']} "
                             f"(0..{model.cfg.n_layers - 1}): retrain with --train")


def score_prompts(model, detector: dict, records: list[dict], work: str | Path, progress: bool = True) -> list[dict]:
    """Per row: the injection probability under each view.

    The captures are cached under ``work`` in a folder keyed by the detector's content, the model
    (weights, dtype) and the prompts, so two detectors, or two models, never share one.
    """
    from workbench.capture import normalize_prompts, prompts_sha256

    check_detector(model, detector)
    records = normalize_prompts(records)
    config = DetectorConfig(**detector["config"])
    key = content_key(content_key(detector), model_identity(model), detector["layer"], prompts_sha256(records))
    views = features(model, records, detector["layer"], Path(work) / key, config,
                     reference=np.asarray(detector["reference"]), progress=progress)
    scores = {view: score_logistic(detector["views"][view]["params"], views[view][0]) for view in VIEWS}
    return [{**{k: v for k, v in r.items() if k != "text"}, **{f"score_{v}": float(scores[v][i]) for v in VIEWS}}
            for i, r in enumerate(records)]
