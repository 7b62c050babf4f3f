"""The probe's results as typed records: one per layer, one per condition, one per run.

``report.json`` is ``ProbeReport.to_dict()``; everything that reads a report (the CLI table, the HTML
figures, the app, the study jobs) goes through ``ProbeReport.from_dict`` / ``load_report``, so a field is
spelled once, here. ``REPORT_FORMAT`` is bumped when a field changes meaning; a report of another format
is refused with a line that says to re-run the probe (reports written before formats existed are read as
format 1: their fields are the same).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.probe.config import ProbeConfig

REPORT_FORMAT = 1


def _known(cls, data: dict) -> dict:
    """The entries of ``data`` that are fields of ``cls`` (a record may carry extra, newer keys)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class LayerResult:
    """One layer of one condition: the subsample protocol's statistics, per summary feature, and the AUCs.

    Per-feature lists are aligned with ``features``; ``q_*`` (Benjamini-Hochberg across layers x features),
    ``moved`` and ``signature`` are filled once every layer of the condition is known.
    """

    layer: int
    k: int  # points per subsampled cloud
    n_clean: int
    n_adversarial: int
    features: list[str]
    mean_clean: list[float]
    mean_adversarial: list[float]
    g: list[float]  # Hedges g, adversarial - clean
    g_low: list[float]
    g_high: list[float]
    p_welch: list[float]
    p_perm: list[float]
    p_parts: list[float]  # Welch on per-part means: the honest test (subsamples of a part overlap)
    auc_topology: float  # PH summaries + logistic regression, cross-validated over parts
    auc_probe_rows: float  # linear probe on the same rows, per prompt
    auc_probe_means: float  # linear probe on subsample means
    example_diagrams: dict[str, list] = field(default_factory=dict)  # one subsample per class (diagram lists)
    protocol: int = 0
    key: str = ""  # the cache key of the inputs this layer was computed from
    q_perm: list[float] = field(default_factory=list)
    q_welch: list[float] = field(default_factory=list)
    q_parts: list[float] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)  # sentences for the features with q < 0.05
    signature: dict[str, str] = field(default_factory=dict)  # per signature feature: agrees / opposes / n.s.

    def value(self, name: str, feature: str) -> float:
        """A per-feature statistic (``"g"``, ``"q_perm"``, ...) of one feature; NaN if the feature is absent."""
        if feature not in self.features:
            return math.nan
        values = getattr(self, name)
        return values[self.features.index(feature)] if values else math.nan

    @property
    def signature_agrees(self) -> int:
        return sum(v == "agrees" for v in self.signature.values())

    @property
    def signature_opposes(self) -> int:
        return sum(v == "opposes" for v in self.signature.values())

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, layer: int | None = None) -> LayerResult:
        data = dict(data)
        if layer is not None:
            data["layer"] = layer
        return cls(**_known(cls, data))


@dataclass
class ConditionSummary:
    """The layer a condition is best told apart at, and where the compression signature holds."""

    best_topology_layer: int
    best_topology_auc: float
    mean_topology_auc: float
    mean_probe_auc: float
    layers_with_signature: list[int]  # >= 3 signature features agree and none opposes
    signature_agreements: dict[int, int]
    signature_oppositions: dict[int, int]

    @classmethod
    def of(cls, layers: dict[int, LayerResult]) -> ConditionSummary:
        order = sorted(layers)
        best = max(order, key=lambda L: layers[L].auc_topology)
        return cls(
            best_topology_layer=best, best_topology_auc=layers[best].auc_topology,
            mean_topology_auc=float(sum(layers[L].auc_topology for L in order) / len(order)),
            mean_probe_auc=float(sum(layers[L].auc_probe_rows for L in order) / len(order)),
            layers_with_signature=[L for L in order if layers[L].signature_agrees >= 3 and not layers[L].signature_opposes],
            signature_agreements={L: layers[L].signature_agrees for L in order},
            signature_oppositions={L: layers[L].signature_opposes for L in order},
        )

    @classmethod
    def from_dict(cls, data: dict) -> ConditionSummary:
        data = _known(cls, data)
        for name in ("signature_agreements", "signature_oppositions"):  # JSON keys are strings
            data[name] = {int(k): v for k, v in data[name].items()}
        return cls(**data)


@dataclass
class ConditionResult:
    """Every layer of one condition, its summary, neuron-level flow and this run's seconds per stage."""

    condition: str
    adversarial_label: str
    sites: list[str]
    layers: dict[int, LayerResult]
    summary: ConditionSummary
    neuron_flow: dict = field(default_factory=dict)  # see ``probe.run.flow_by_class``; {} when skipped
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def best(self) -> LayerResult:
        return self.layers[self.summary.best_topology_layer]

    def to_dict(self) -> dict:
        out = asdict(self)
        out["layers"] = {str(L): r.to_dict() for L, r in self.layers.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict, condition: str | None = None) -> ConditionResult:
        data = dict(data)
        layers = {int(L): LayerResult.from_dict(r, int(L)) for L, r in data["layers"].items()}
        return cls(condition=data.get("condition", condition), adversarial_label=data["adversarial_label"],
                   sites=list(data["sites"]), layers=dict(sorted(layers.items())),
                   summary=ConditionSummary.from_dict(data["summary"]), neuron_flow=data.get("neuron_flow") or {},
                   seconds=data.get("seconds") or {})


@dataclass
class ProbeReport:
    """One probe run: its configuration, the model record, versions, and one result per condition."""

    config: ProbeConfig
    model: dict  # the model's workbench record (name, weights_sha256, ...)
    versions: dict
    conditions: dict[str, ConditionResult] = field(default_factory=dict)
    format: int = REPORT_FORMAT

    @property
    def model_name(self) -> str:
        return self.model.get("name", "?")

    def to_dict(self) -> dict:
        return {"format": self.format, "config": asdict(self.config), "model": self.model, "versions": self.versions,
                "conditions": {name: c.to_dict() for name, c in self.conditions.items()}}

    @classmethod
    def from_dict(cls, data: dict, where: str = "the report") -> ProbeReport:
        if not isinstance(data, dict) or not data.get("conditions"):
            raise WorkbenchError(f"{where} holds no probe conditions; re-run `workbench probe`")
        found = data.get("format", 1)
        if found != REPORT_FORMAT:
            raise WorkbenchError(f"{where} is a probe report of format {found!r}, this workbench reads format "
                                 f"{REPORT_FORMAT}: re-run `workbench probe`")
        try:
            return cls(config=ProbeConfig.from_dict(data["config"]), model=dict(data.get("model") or {}),
                       versions=dict(data.get("versions") or {}),
                       conditions={name: ConditionResult.from_dict(c, name) for name, c in data["conditions"].items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise WorkbenchError(f"{where} is not a complete probe report ({type(exc).__name__}: {exc}); "
                                 "re-run `workbench probe`") from None


def load_report(path: str | Path) -> ProbeReport:
    """The ``ProbeReport`` in ``path`` (a run folder or its ``report.json``), or a one-line WorkbenchError."""
    path = Path(path)
    file = path / "report.json" if path.is_dir() else path
    if not file.is_file():
        raise WorkbenchError(f"no report.json in {path}: pick a folder written by `workbench probe`")
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise WorkbenchError(f"{file} is not a readable probe report ({exc}); re-run `workbench probe`") from None
    return ProbeReport.from_dict(data, str(file))
