"""The probe: does adversarial input change the topology of a model's activations, layer by layer?

``config`` (ProbeConfig), ``schema`` (the typed results: LayerResult, ConditionResult, ProbeReport, and
``load_report``), ``run`` (the analysis over an activation store), ``figures`` (tables and plots of a
report). ``workbench.commands.probe`` runs it on a model and writes the run folder.
"""

from workbench.probe.config import LAYER_PROTOCOL, MIN_POINTS, ProbeConfig
from workbench.probe.run import (
    analyze_condition,
    analyze_layer,
    class_clouds,
    condition_prompts,
    flow_by_class,
    layer_key,
    moved_features,
    signature_agreement,
)
from workbench.probe.schema import (
    REPORT_FORMAT,
    ConditionResult,
    ConditionSummary,
    LayerResult,
    ProbeReport,
    load_report,
)

__all__ = ["LAYER_PROTOCOL", "MIN_POINTS", "REPORT_FORMAT", "ConditionResult", "ConditionSummary", "LayerResult",
           "ProbeConfig", "ProbeReport", "analyze_condition", "analyze_layer", "class_clouds", "condition_prompts",
           "flow_by_class", "layer_key", "load_report", "moved_features", "signature_agreement"]
