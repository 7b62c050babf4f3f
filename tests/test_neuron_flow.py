"""Neuron-level flow: shapes, known values, and the permutation control."""

import numpy as np
import pytest

from workbench.errors import WorkbenchError
from workbench.topology.neuron_flow import neuron_cloud, neuron_flow, total_h1_persistence


def _layers(n_samples, n_layers, width, coupled, seed):
    """Layer l+1 = layer l + small noise when coupled, an independent draw otherwise (same marginals)."""
    rng = np.random.default_rng(seed)
    acts = np.empty((n_samples, n_layers, width))
    acts[:, 0] = rng.standard_normal((n_samples, width))
    for layer in range(1, n_layers):
        if coupled:
            prev = acts[:, layer - 1]
            acts[:, layer] = (prev + 0.05 * rng.standard_normal(prev.shape)) / np.sqrt(1 + 0.05**2)
        else:
            acts[:, layer] = rng.standard_normal((n_samples, width))
    return acts


def test_circle_cloud_total_h1_is_its_one_loop():
    t = np.linspace(0, 2 * np.pi, 200, endpoint=False)
    cloud = neuron_cloud(np.cos(t), np.sin(t))
    assert cloud.shape == (200, 2)
    alpha = total_h1_persistence(cloud, "alpha")
    rips = total_h1_persistence(cloud, "rips")
    assert alpha == pytest.approx(2.0 - 2 * np.sin(np.pi / 200), abs=0.02)  # diameter scale
    assert rips == pytest.approx(np.sqrt(3), abs=0.05)  # the Rips loop dies at the inscribed triangle
    assert total_h1_persistence(np.zeros((10, 2))) == 0.0


def test_result_shapes_and_skipped_gaps():
    acts = _layers(3, 5, 60, True, 0)
    res = neuron_flow(acts, gaps=(1, 3, 10))
    assert res.gaps == (1, 3)
    assert res.totals[1].shape == (4, 3) and res.totals[3].shape == (2, 3)
    assert res.pairs[3] == [(0, 3), (1, 4)]
    assert res.curve(1).shape == (4,)
    by_name = neuron_flow({f"blocks.{i}": acts[:, i] for i in range(5)}, gaps=(2,))
    assert by_name.pairs[2][0] == ("blocks.0", "blocks.2")
    np.testing.assert_allclose(by_name.totals[2], neuron_flow(acts, gaps=(2,)).totals[2])


def test_permutation_destroys_the_flow_signal():
    coupled = _layers(4, 4, 300, True, 1)
    independent = _layers(4, 4, 300, False, 2)
    a, b = neuron_flow(coupled, gaps=(1,)), neuron_flow(independent, gaps=(1,))
    assert a.mean(1) < 0.5 * b.mean(1)  # a thin diagonal band has little H1; a blob has a lot
    pa = neuron_flow(coupled, gaps=(1,), permute=True, seed=3)
    pb = neuron_flow(independent, gaps=(1,), permute=True, seed=4)
    assert pa.permuted and pa.mean(1) == pytest.approx(pb.mean(1), rel=0.25)


def test_normalize_makes_scale_irrelevant():
    acts = _layers(2, 3, 80, False, 5)
    scaled = acts * np.array([1.0, 10.0, 100.0])[None, :, None]
    a = neuron_flow(acts, gaps=(1,), normalize=True).totals[1]
    b = neuron_flow(scaled, gaps=(1,), normalize=True).totals[1]
    np.testing.assert_allclose(a, b, rtol=1e-8)


def test_bad_activations():
    with pytest.raises(WorkbenchError, match="n_samples, n_layers"):
        neuron_flow(np.zeros((3, 4)))
    acts = _layers(3, 3, 20, True, 6)
    acts[1, 2, 5] = np.nan
    with pytest.raises(WorkbenchError, match=r"samples \[1\]"):
        neuron_flow(acts)
    with pytest.raises(WorkbenchError, match="widths"):
        neuron_cloud(np.zeros(4), np.zeros(5))
    with pytest.raises(WorkbenchError, match="gaps"):
        neuron_flow(_layers(2, 3, 20, True, 7), gaps=(0,))
    with pytest.raises(WorkbenchError, match="method"):
        neuron_flow(_layers(2, 3, 20, True, 7), method="cech")


def test_flow_contrast_separates_conditions_and_the_control_does_not():
    from workbench.topology.neuron_flow import flow_contrast

    coupled = _layers(12, 3, 200, True, 8)
    independent = _layers(12, 3, 200, False, 9)
    res = flow_contrast(coupled, independent, gaps=(1,), n_perm=300)
    assert res.g[1].shape == (2,) and np.all(res.g[1] > 2)  # b (independent) has far more H1
    assert np.all(res.q[1] < 0.05)
    assert np.all(np.abs(res.control_g[1]) < 1.5) and np.all(res.control_q[1] > 0.01)


@pytest.mark.parametrize("kind", ["gaussian", "heavy-tailed", "grid", "repeated", "neuron-pairs", "collinear"])
def test_alpha_total_h1_without_pairing_equals_the_sum_of_gudhis_bars(kind):
    """Triangles minus edges plus MST edges: the same total as gudhi's diagram, degenerate clouds included
    (a grid is all cocircular quadruples; repeated points; a line has no triangle)."""
    from workbench.topology.neuron_flow import alpha_total_h1
    from workbench.topology.persistence import alpha_persistence

    rng = np.random.default_rng(len(kind))
    X = {"gaussian": lambda: rng.normal(size=(400, 2)), "heavy-tailed": lambda: rng.standard_t(2, size=(300, 2)),
         "grid": lambda: np.stack(np.meshgrid(np.arange(8.0), np.arange(6.0)), -1).reshape(-1, 2),
         "repeated": lambda: np.repeat(rng.normal(size=(60, 2)), 3, axis=0),
         "neuron-pairs": lambda: neuron_cloud(*rng.standard_t(3, size=(2, 576))),
         "collinear": lambda: np.c_[np.arange(20.0), 2 * np.arange(20.0)]}[kind]()
    bars = alpha_persistence(X).dgms[1]
    expected = float((bars[:, 1] - bars[:, 0]).sum())
    assert alpha_total_h1(X) == pytest.approx(expected, rel=1e-8, abs=1e-9)
    assert (expected > 1) == (kind not in ("collinear",))  # the check is not vacuous


def test_total_h1_refuses_bad_clouds_instead_of_reading_them_as_empty():
    """The planar shortcut never turns NaN into a zero; other dimensions take the validated diagram path."""
    from workbench.errors import WorkbenchError
    from workbench.topology.neuron_flow import alpha_total_h1
    from workbench.topology.persistence import alpha_persistence

    bad = np.random.default_rng(0).normal(size=(50, 2))
    bad[3, 1] = np.nan
    with pytest.raises(WorkbenchError, match="NaN"):
        total_h1_persistence(bad)
    with pytest.raises(WorkbenchError, match="NaN"):
        alpha_total_h1(bad)
    cube = np.random.default_rng(1).normal(size=(80, 3))
    bars = alpha_persistence(cube).dgms[1]
    assert total_h1_persistence(cube) == pytest.approx(float((bars[:, 1] - bars[:, 0]).sum()))


def test_threads_change_nothing():
    acts = np.random.default_rng(3).standard_normal((5, 6, 40))
    for permute in (False, True):
        one = neuron_flow(acts, gaps=(1, 2), permute=permute, seed=4, n_jobs=1)
        two = neuron_flow(acts, gaps=(1, 2), permute=permute, seed=4, n_jobs=2)
        assert all(np.array_equal(one.totals[g], two.totals[g]) for g in (1, 2)) and one.totals[1].any()
