"""Persistence against ripser/gudhi and on clouds whose homology is known."""

import math

import gudhi
import numpy as np
import pytest
import ripser
from workbench.kernels import pairwise_distances

from workbench.errors import WorkbenchError
from workbench.topology.persistence import (
    alpha_persistence,
    h0_persistence,
    mst_weights_blocked,
    mst_weights_dense,
    rips_persistence,
)


def circle(n, r=1.0, center=(0.0, 0.0), noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, 2 * np.pi, n)
    pts = np.c_[r * np.cos(t), r * np.sin(t)] + np.asarray(center)
    return pts + noise * rng.standard_normal(pts.shape)


def long_bars(dgm, min_life):
    life = dgm[:, 1] - dgm[:, 0]
    return int(np.count_nonzero(life > min_life))


def ripser_h0(X, thresh=math.inf):
    D = pairwise_distances(X.astype(np.float64))
    return ripser.ripser(D, distance_matrix=True, maxdim=0, thresh=thresh)["dgms"][0]


@pytest.mark.parametrize("method", ["dense", "blocked"])
@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_h0_deaths_equal_ripser(method, offset):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((300, 12)) * rng.uniform(0.1, 3, 12) + offset
    X = np.vstack([X, X[:5]])  # duplicates: zero bars, dropped by both
    ours = h0_persistence(X, method=method)
    ref = ripser_h0(X)
    assert ours.shape == ref.shape
    assert np.isinf(ours[:, 1]).sum() == 1 and np.isinf(ref[:, 1]).sum() == 1
    np.testing.assert_allclose(np.sort(ours[:-1, 1]), np.sort(ref[:-1, 1]), rtol=1e-5, atol=1e-4)
    assert np.all(ours[:, 0] == 0)


def test_h0_threshold_leaves_one_infinite_bar_per_component():
    X = np.vstack(
        [circle(40, seed=2), circle(40, center=(10, 0), seed=3), circle(40, center=(0, 30), seed=4)]
    )
    ours = h0_persistence(X, thresh=2.0)
    ref = ripser_h0(X, thresh=2.0)
    assert np.isinf(ours[:, 1]).sum() == np.isinf(ref[:, 1]).sum() == 3
    np.testing.assert_allclose(np.sort(ours[:-3, 1]), np.sort(ref[:-3, 1]), rtol=1e-5)


def test_blocked_mst_rescans_when_lists_run_out():
    # tight clusters far apart: every 3-nearest list stays inside its cluster
    rng = np.random.default_rng(5)
    centers = rng.standard_normal((6, 4)) * 50
    X = (centers.repeat(30, axis=0) + rng.standard_normal((180, 4))).astype(np.float32)
    dense = np.sort(mst_weights_dense(pairwise_distances(X)))
    blocked = np.sort(mst_weights_blocked(X, k=3, block_size=64))
    np.testing.assert_allclose(blocked, dense, rtol=1e-5)


def test_circle_has_one_long_h1_bar():
    res = rips_persistence(circle(80, noise=0.02), maxdim=1)
    assert res.backend == "giotto-ph" and res.hausdorff == 0.0 and res.landmarks is None
    assert long_bars(res.dgms[1], 0.5) == 1
    assert np.isinf(res.dgms[0][:, 1]).sum() == 1


def test_two_circles_and_figure_eight_have_two_long_bars():
    two = np.vstack([circle(60, seed=1), circle(60, r=1.5, center=(5, 0), seed=2)])
    assert long_bars(rips_persistence(two).dgms[1], 0.5) == 2
    eight = np.vstack([circle(60, seed=3), circle(60, center=(2, 0), seed=4)])  # circles touch at (1, 0)
    assert long_bars(rips_persistence(eight).dgms[1], 0.5) == 2


def test_torus_has_two_loops_and_a_void():
    rng = np.random.default_rng(0)
    u, v = rng.uniform(0, 2 * np.pi, (2, 1500))
    R, r = 2.0, 0.9
    X = np.c_[(R + r * np.cos(v)) * np.cos(u), (R + r * np.cos(v)) * np.sin(u), r * np.sin(v)]
    res = alpha_persistence(X, maxdim=2)
    assert long_bars(res.dgms[1], 0.8) == 2
    assert long_bars(res.dgms[2], 0.3) == 1


def test_sphere_rips_h2():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((60, 3))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    res = rips_persistence(X, maxdim=2)
    assert long_bars(res.dgms[2], 0.4) == 1
    assert long_bars(res.dgms[1], 0.4) == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rips_agrees_with_gudhi_on_random_clouds(seed):
    X = np.random.default_rng(seed).standard_normal((35, 3))
    ours = rips_persistence(X, maxdim=2)
    st = gudhi.RipsComplex(points=X).create_simplex_tree(max_dimension=3)
    st.compute_persistence()
    for dim in range(3):
        ref = st.persistence_intervals_in_dimension(dim)
        assert gudhi.bottleneck_distance(ours.dgms[dim], ref) < 1e-5


def test_giotto_and_ripser_backends_agree():
    X = np.random.default_rng(3).standard_normal((60, 5))
    a = rips_persistence(X, backend="giotto", n_threads=1)
    b = rips_persistence(X, backend="ripser")
    assert b.backend == "ripser"
    for da, db in zip(a.dgms, b.dgms, strict=True):
        assert gudhi.bottleneck_distance(da, db) < 1e-5


def test_threshold_cuts_the_filtration():
    X = circle(60, noise=0.01)
    res = rips_persistence(X, thresh=1.0)
    assert res.thresh == 1.0
    assert np.isinf(res.dgms[1][:, 1]).sum() == 1  # the loop has not died by scale 1.0
    assert np.all(res.dgms[1][:, 0] <= 1.0)


def test_landmarks_report_a_bound_that_holds():
    X = np.vstack([circle(300, noise=0.05, seed=7), circle(300, r=2, center=(6, 0), noise=0.05, seed=8)])
    full = rips_persistence(X)
    lm = rips_persistence(X, landmarks=60, landmark_method="maxmin")
    assert lm.landmarks.shape == (60,) and len(set(lm.landmarks.tolist())) == 60
    assert lm.n_points == 600 and 0 < lm.hausdorff < 1
    D = pairwise_distances(X.astype(np.float64))
    assert lm.hausdorff == pytest.approx(D[:, lm.landmarks].min(1).max(), rel=1e-4)
    for dim in (0, 1):
        finite = [d[np.isfinite(d[:, 1])] for d in (full.dgms[dim], lm.dgms[dim])]
        assert gudhi.bottleneck_distance(*finite) <= lm.bottleneck_bound + 1e-6
    assert long_bars(lm.dgms[1], 0.5) == 2


def test_alpha_h0_on_diameter_scale_equals_rips_h0():
    X = np.random.default_rng(4).standard_normal((200, 2))
    a = alpha_persistence(X, maxdim=1)
    np.testing.assert_allclose(np.sort(a.dgms[0][:-1, 1]), np.sort(ripser_h0(X)[:-1, 1]), rtol=1e-6)
    r = alpha_persistence(X, maxdim=1, scale="radius")
    np.testing.assert_allclose(r.dgms[1] * 2, a.dgms[1])


def test_alpha_refuses_high_dimensional_clouds():
    with pytest.raises(WorkbenchError, match="rips_persistence"):
        alpha_persistence(np.random.default_rng(0).standard_normal((10, 5)))


def test_cosine_metric_and_distance_matrix_input():
    X = np.random.default_rng(6).standard_normal((50, 8)) + 3
    a = rips_persistence(X, metric="cosine")
    D = pairwise_distances(X, metric="cosine")
    b = rips_persistence(D, distance_matrix=True)
    for da, db in zip(a.dgms, b.dgms, strict=True):
        assert gudhi.bottleneck_distance(da, db) < 1e-6
    with pytest.raises(WorkbenchError, match="symmetric"):
        rips_persistence(D + np.triu(np.ones_like(D)), distance_matrix=True)


def test_large_cloud_with_threshold_uses_sparse_edges(monkeypatch):
    import workbench.topology.persistence as P

    X = circle(400, noise=0.02, seed=9)
    dense = rips_persistence(X, thresh=0.6)
    monkeypatch.setattr(P, "DENSE_H0_MAX", 100)
    sparse = rips_persistence(X, thresh=0.6)
    assert sparse.backend.endswith("-sparse")
    for a, b in zip(dense.dgms, sparse.dgms, strict=True):
        assert a.shape == b.shape
        assert gudhi.bottleneck_distance(a, b) < 1e-5


def test_random_landmarks_report_their_own_bound():
    X = np.vstack([circle(300, noise=0.05, seed=10), circle(300, r=2, center=(6, 0), noise=0.05, seed=11)])
    lm = rips_persistence(X, landmarks=120, landmark_method="random", seed=3)
    D = pairwise_distances(X.astype(np.float64))
    assert lm.hausdorff == pytest.approx(D[:, lm.landmarks].min(1).max(), rel=1e-4)
    full = rips_persistence(X)
    finite = [d[np.isfinite(d[:, 1])] for d in (full.dgms[1], lm.dgms[1])]
    assert gudhi.bottleneck_distance(*finite) <= lm.bottleneck_bound + 1e-6
    with pytest.raises(WorkbenchError, match="landmark_method"):
        rips_persistence(X, landmarks=10, landmark_method="kmeans")


def test_device_argument_routes_distances_through_torch():
    X = circle(50, noise=0.02, seed=12)
    a = rips_persistence(X, device="cpu")
    b = rips_persistence(X)
    for da, db in zip(a.dgms, b.dgms, strict=True):
        np.testing.assert_array_equal(da, db)
    np.testing.assert_array_equal(h0_persistence(X, device="cpu"), h0_persistence(X))


def test_full_h0_with_landmarks_is_the_exact_h0():
    X = circle(300, noise=0.05, seed=13)
    lm = rips_persistence(X, landmarks=50, full_h0=True)
    assert lm.extras["h0"] == "full cloud" and len(lm.landmarks) == 50
    np.testing.assert_array_equal(lm.dgms[0], rips_persistence(X, maxdim=0).dgms[0])
    assert len(rips_persistence(X, landmarks=50).dgms[0]) == 50  # landmark H0 otherwise


def test_item_cache_keeps_values_exactly_and_keys_by_every_input(tmp_path):
    import math

    import numpy as np
    import torch

    from workbench.io import ItemCache

    kept = ItemCache.keyed(tmp_path, ["eval", 1], np.arange(4))
    value = {"x": np.float32(0.1), "n": np.int64(3), "nan": math.nan, "v": np.array([1.5, 2.5]), "t": torch.tensor([1, 2])}
    kept.put("a/b", {"p": 1}, value)
    got = ItemCache.keyed(tmp_path, ["eval", 1], np.arange(4)).get("a/b", {"p": 1})
    assert got["x"] == float(np.float32(0.1)) and got["n"] == 3 and math.isnan(got["nan"])
    assert got["v"] == [1.5, 2.5] and got["t"] == [1, 2]
    assert kept.get("a/b", {"p": 2}) is None  # another item
    assert ItemCache.keyed(tmp_path, ["eval", 1], np.arange(5)).get("a/b", {"p": 1}) is None  # other arrays
    assert ItemCache.keyed(tmp_path, ["eval", 2], np.arange(4)).get("a/b", {"p": 1}) is None  # other parts
    assert ItemCache.keyed(None, ["eval", 1]).get("a/b", {"p": 1}) is None  # None keeps nothing
    next(kept.folder.iterdir()).write_text("[1, 2")  # damaged: missing, computed again
    assert kept.get("a/b", {"p": 1}) is None
