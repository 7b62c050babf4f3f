"""``run_topology_file``: the files it writes and the summary it returns."""

import json

import numpy as np
import pytest

from workbench.commands.topology import run_topology_file
from workbench.errors import WorkbenchError
from workbench.topology.diagrams import load_diagrams


@pytest.fixture
def circle_file(tmp_path):
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 2 * np.pi, 120)
    X = np.c_[np.cos(t), np.sin(t), 0.01 * rng.standard_normal(120)] + 1e4
    path = tmp_path / "circle.npy"
    np.save(path, X)
    return path


def test_writes_json_with_null_infinite_deaths_and_an_html_plot(circle_file, tmp_path):
    out = tmp_path / "run"
    summary = run_topology_file(
        circle_file, maxdim=1, metric="euclidean", landmarks=None, thresh=None, out=out
    )
    doc = json.loads((out / "diagrams.json").read_text())
    assert len(doc["dgms"]) == 2
    assert sum(d is None for _, d in doc["dgms"][0]) == 1  # the essential H0 class
    assert doc["thresh"] is None and doc["landmarks"] is None and doc["hausdorff"] == 0
    html = (out / "diagram.html").read_text()
    assert "plotly" in html.lower() and "barcode" in html
    assert summary["dims"]["H1"]["longest"] > 1.0
    assert summary["dims"]["H0"]["infinite"] == 1
    dgms = load_diagrams(out / "diagrams.json")
    assert np.isinf(dgms[0][:, 1]).sum() == 1 and dgms[1].shape[1] == 2


def test_landmarks_threshold_and_cosine_are_reported(circle_file, tmp_path):
    s = run_topology_file(circle_file, maxdim=1, metric="euclidean", landmarks=40, thresh=1.0, out=tmp_path)
    assert s["n_used"] == 40 and s["n_points"] == 120 and s["bottleneck_bound"] > 0
    assert s["thresh"] == 1.0 and s["dims"]["H1"]["infinite"] == 1  # the loop outlives the threshold
    doc = json.loads((tmp_path / "diagrams.json").read_text())
    assert len(doc["landmarks"]) == 40 and doc["thresh"] == 1.0
    c = run_topology_file(np.load(circle_file) - 1e4, maxdim=0, metric="cosine", out=tmp_path / "c")
    assert c["metric"] == "cosine" and c["maxdim"] == 0


def test_unreadable_inputs(tmp_path):
    with pytest.raises(WorkbenchError, match="not found"):
        run_topology_file(tmp_path / "missing.npy", out=tmp_path)
    np.savez(tmp_path / "two.npz", a=np.zeros((3, 2)), b=np.zeros((3, 2)))
    with pytest.raises(WorkbenchError, match="2 arrays"):
        run_topology_file(tmp_path / "two.npz", out=tmp_path)
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(WorkbenchError, match="readable"):
        run_topology_file(tmp_path / "obj.npy", out=tmp_path)
    (tmp_path / "text.npy").write_text("hello")
    with pytest.raises(WorkbenchError, match="readable"):
        run_topology_file(tmp_path / "text.npy", out=tmp_path)


def test_importing_the_cli_implementation_stays_light():
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, workbench.topology, workbench.commands.topology\n"
        "heavy = [m for m in ('torch', 'gudhi', 'gph', 'ripser', 'sklearn', 'plotly', 'triton') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
