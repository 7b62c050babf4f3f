"""Job functions for ``workbench study run``: ``fn(params: dict, work: Path) -> dict | list[dict]``.

Each is a pure function of its parameters (seeded), so the local and the Ray engine agree.
"""

from __future__ import annotations

from pathlib import Path


def probe(params: dict, work: Path) -> list[dict]:
    """One probe (model x condition); rows per layer with the signature features (see ``probe.report_rows``)."""
    from workbench.models import load_model
    from workbench.probe import ProbeConfig, report_rows, run_probe

    params = dict(params)
    name, condition = params.pop("model"), params.pop("condition", "injection")
    model = load_model(name, device=params.pop("device", "cpu"))
    layers = _layers(params.pop("layers", None), model.cfg.n_layers)
    if "flow_gaps" in params:
        params["flow_gaps"] = tuple(params["flow_gaps"])
    config = ProbeConfig(model=name, conditions=(condition,), layers=layers, **params)
    report = run_probe(model, config, Path(work) / f"probe-{name}-{condition}-seed{config.seed}")
    return report_rows(report)


def _layers(spec, n_layers: int) -> list[int] | None:
    """``None``/"all", "every-N" (always keeping the last layer), or an explicit list."""
    if spec in (None, "all"):
        return None
    if isinstance(spec, str) and spec.startswith("every-"):
        step = int(spec.split("-", 1)[1])
        return sorted(set(range(0, n_layers, step)) | {n_layers - 1})
    return [int(x) for x in spec]


def cloud_topology(params: dict, work: Path) -> dict:
    """Barcode summary of a seeded noisy circle in ``dim`` dimensions: a cheap job for tests and tutorials."""
    import numpy as np

    from workbench.topology.persistence import rips_persistence
    from workbench.topology.summaries import BarcodeSummary

    rng = np.random.default_rng(params["seed"])
    n, dim, noise = int(params.get("n", 80)), int(params.get("dim", 3)), float(params.get("noise", 0.1))
    angles = rng.uniform(0, 2 * np.pi, n)
    X = np.zeros((n, dim))
    X[:, 0], X[:, 1] = np.cos(angles), np.sin(angles)
    X += noise * rng.normal(size=X.shape)
    result = rips_persistence(X, maxdim=1)
    summary = BarcodeSummary().fit([result])
    values = summary.transform([result])[0]
    return {name: float(v) for name, v in zip(summary.get_feature_names_out(), values, strict=True)}
