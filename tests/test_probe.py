import json

import numpy as np
import pytest

from workbench.capture import capture
from workbench.commands.probe import run_probe
from workbench.errors import WorkbenchError
from workbench.probe import (
    ProbeConfig,
    analyze_layer,
    class_clouds,
    moved_features,
    signature_agreement,
)

SMALL = dict(model="tiny", n_pairs=30, k=12, K=6, n_parts=2, n_boot=50, n_perm=100, flow_samples=4, flow_gaps=(1, 2),
             layers=[0, 1, 3], batch_size=16)


@pytest.fixture(scope="module")
def probe_run(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("probe")
    return out, run_probe(tiny, ProbeConfig(**SMALL), out, progress=False)


def test_probe_writes_a_complete_report(probe_run):
    out, report = probe_run
    assert (out / "report.html").stat().st_size > 100_000  # plotly.js inline: opens offline
    saved = json.loads((out / "report.json").read_text())
    assert saved["config"]["seed"] == 0 and saved["versions"]["torch"]
    result = saved["conditions"]["injection"]
    assert list(result["layers"]) == ["0", "1", "3"]
    layer = result["layers"]["1"]
    n = len(layer["features"])
    for key in ("g", "g_low", "g_high", "p_welch", "p_perm", "q_perm", "q_welch", "mean_clean", "mean_adversarial"):
        assert len(layer[key]) == n
    assert all(lo <= g <= hi for lo, g, hi in zip(layer["g_low"], layer["g"], layer["g_high"], strict=True)
               if np.isfinite(g))
    assert all(0 <= q <= 1 for q in layer["q_perm"])
    assert 0 <= layer["auc_topology"] <= 1 and 0 <= layer["auc_probe_rows"] <= 1
    assert layer["n_clean"] == layer["n_adversarial"] == 30
    assert set(layer["example_diagrams"]) == {"clean", "adversarial"}
    flow = result["neuron_flow"]["gaps"]["1"]
    assert len(flow["pairs"]) == 2 and set(flow) >= {"flow", "control"}


def test_report_reads_back_as_the_same_typed_records(probe_run):
    from workbench.probe import REPORT_FORMAT, ProbeReport, load_report

    out, report = probe_run
    loaded = load_report(out)
    assert loaded == report and loaded.format == REPORT_FORMAT
    assert ProbeReport.from_dict(loaded.to_dict()) == report
    result = loaded.conditions["injection"]
    assert list(result.layers) == [0, 1, 3] and result.best is result.layers[result.summary.best_topology_layer]
    assert set(result.summary.signature_agreements) == {0, 1, 3}
    assert loaded.config.flow_gaps == (1, 2) and loaded.config.conditions == ("injection",)


def test_a_report_of_another_format_or_incomplete_is_refused(probe_run, tmp_path):
    from workbench.probe import load_report

    out, report = probe_run
    data = report.to_dict()
    (tmp_path / "report.json").write_text(json.dumps({**data, "format": 99}))
    with pytest.raises(WorkbenchError, match="format 99, this workbench reads format 1: re-run"):
        load_report(tmp_path)
    del data["conditions"]["injection"]["layers"]["1"]["g"]
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(WorkbenchError, match="not a complete probe report"):
        load_report(tmp_path / "report.json")


def test_probe_resumes_from_cached_layers(tiny, probe_run):
    out, report = probe_run
    cached = out / "layers" / "injection" / "layer-001.json"
    stamp = cached.stat().st_mtime_ns
    again = run_probe(tiny, ProbeConfig(**SMALL), out, progress=False)
    assert cached.stat().st_mtime_ns == stamp
    assert again.conditions["injection"].layers[1].g == report.conditions["injection"].layers[1].g


def test_same_seed_same_numbers(tiny, tmp_path):
    config = ProbeConfig(**{**SMALL, "layers": [2], "flow_samples": 0})
    a = run_probe(tiny, config, tmp_path / "a", progress=False).conditions["injection"].layers[2]
    b = run_probe(tiny, config, tmp_path / "b", progress=False).conditions["injection"].layers[2]
    assert a.g == b.g and a.auc_topology == b.auc_topology and a.p_perm == b.p_perm


def test_detects_a_planted_difference():
    """Two clouds that differ in scale: H0 deaths must be higher for the wider one, and AUC near 1."""
    rng = np.random.default_rng(0)
    clean = rng.normal(size=(120, 16))
    wide = 1.5 * rng.normal(size=(120, 16))
    config = ProbeConfig(k=20, K=16, n_parts=4, n_boot=100, n_perm=200)
    result = analyze_layer(clean, wide, config, seed=0)
    assert result.value("g", "h0_death_mean") > 2 and result.value("p_perm", "h0_death_mean") < 0.01
    assert result.auc_topology > 0.9


def test_sentences_and_signature():
    names = ["h0_death_mean", "h1_count", "h1_persistence_mean", "h1_entropy"]
    g, q = [1.0, -2.0, 0.5, 0.7], [0.01, 0.001, 0.5, 0.02]
    assert moved_features(names, g, q)[0].startswith("h1_count lower under attack")
    assert signature_agreement(names, g, q) == {"h0_death_mean": "agrees", "h1_count": "agrees",
                                                "h1_persistence_mean": "n.s.", "h1_entropy": "opposes"}


def test_bad_inputs(tiny, tmp_path):
    store = capture(tiny, [{"text": f"p {i}", "label": "clean"} for i in range(8)], ["blocks.0.hook_resid_post"],
                    tmp_path / "s", progress=False)
    with pytest.raises(WorkbenchError, match="no 'injected' rows"):
        class_clouds(store, "blocks.0.hook_resid_post", "injected")
    with pytest.raises(WorkbenchError, match="too few rows"):
        analyze_layer(np.zeros((8, 4)), np.ones((8, 4)), ProbeConfig(), seed=0)
    with pytest.raises(WorkbenchError, match="out of range"):
        run_probe(tiny, ProbeConfig(**{**SMALL, "layers": [7]}), tmp_path / "p", progress=False)
    with pytest.raises(WorkbenchError, match="unknown condition"):
        run_probe(tiny, ProbeConfig(**{**SMALL, "conditions": ("jailbreak",)}), tmp_path / "p", progress=False)


def test_flow_figure_labels_positions_with_layer_numbers():
    from workbench.probe.figures import flow_figure

    curves = {"clean_curve": [1.0, 2.0], "adversarial_curve": [1.5, 2.5]}
    flow = {"layers": [0, 9, 29], "gaps": {"1": {"pairs": [[0, 1], [1, 2]], "flow": curves, "control": curves}}}
    fig = flow_figure(flow, "flow")
    assert list(fig.layout.xaxis.ticktext) == ["0", "9", "29"] and list(fig.layout.xaxis.tickvals) == [0, 1, 2]
    assert len(fig.data) == 4


def test_layers_in_worker_processes_give_the_serial_numbers(probe_run, tmp_path, monkeypatch):
    """The pool only moves where layers run: every layer result equals the in-process one, and each is cached."""
    import workbench.probe.run as run
    from workbench.store import ActivationStore

    out, report = probe_run
    store = ActivationStore(out / "stores" / "injection")
    monkeypatch.setattr(run, "PARALLEL_MIN_WORK", 0)
    pooled = run.analyze_condition(store, "injection", ProbeConfig(**SMALL), tmp_path / "work", False, n_jobs=2)
    assert pooled.layers == report.conditions["injection"].layers
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["layer-000.json", "layer-001.json",
                                                                      "layer-003.json"]
