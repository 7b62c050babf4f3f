"""Statistics across conditions: effect sizes, tests, FDR, leakage-free AUC, probe baselines."""

import numpy as np
import pytest
from scipy.stats import false_discovery_control

from workbench.errors import WorkbenchError
from workbench.topology.stats import (
    DropCorrelated,
    benjamini_hochberg,
    bootstrap_ci,
    compare_conditions,
    cv_auc,
    hedges_g,
    permutation_test,
    subsample_summaries,
    welch_test,
)


def test_hedges_g_and_bootstrap_ci():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((200, 2))
    b = a + np.array([1.0, 0.0])
    g = hedges_g(a, b)
    assert g[0] == pytest.approx(1.0, abs=0.05) and g[1] == pytest.approx(0.0, abs=1e-12)
    lo, hi = bootstrap_ci(a, b, n_boot=200)
    assert lo[0] < g[0] < hi[0] and lo[0] > 0.7
    assert np.all(hedges_g(np.ones((5, 1)), np.ones((5, 1))) == 0)


def test_welch_and_permutation_tests():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((40, 3))
    b = rng.standard_normal((40, 3)) + np.array([2.0, 0.0, 0.0])
    b[:, 2] = a[:, 2] = 5.0  # constant and equal: p = 1
    _, pw = welch_test(a, b)
    pp = permutation_test(a, b, n_perm=300)
    assert pw[0] < 1e-6 and pw[1] > 0.01 and pw[2] == 1.0
    assert pp[0] == pytest.approx(1 / 301) and pp[1] > 0.01 and pp[2] == 1.0


def test_benjamini_hochberg_matches_scipy_and_keeps_shape():
    p = np.random.default_rng(2).uniform(0, 0.2, (3, 7))
    q = benjamini_hochberg(p)
    assert q.shape == p.shape and np.all(q >= p)
    np.testing.assert_allclose(q.ravel(), false_discovery_control(p.ravel(), method="bh"))


def test_drop_correlated_keeps_one_of_each_correlated_group():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((100, 1))
    X = np.hstack(
        [x, 2 * x + 0.01 * rng.standard_normal((100, 1)), rng.standard_normal((100, 1)), np.ones((100, 1))]
    )
    dc = DropCorrelated(0.5).fit(X)
    assert dc.keep_.tolist() == [0, 2]
    assert dc.transform(X).shape == (100, 2)


def _circles(n, seed, d=4):
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, 2 * np.pi, n)
    X = np.zeros((n, d))
    X[:, 0], X[:, 1] = np.cos(t), np.sin(t)
    return X + 0.05 * rng.standard_normal((n, d))


def test_subsamples_are_drawn_inside_disjoint_parts():
    s = subsample_summaries(_circles(120, 0), k=30, K=6, n_parts=3, n_threads=1)
    assert s.features.shape == (6, 62) and len(s.names) == 62
    by_part = [
        np.unique(np.concatenate([r for r, p in zip(s.rows, s.part, strict=True) if p == q]))
        for q in range(3)
    ]
    assert all(np.intersect1d(by_part[i], by_part[j]).size == 0 for i in range(3) for j in range(i + 1, 3))
    with pytest.raises(WorkbenchError, match="k <= 40"):
        subsample_summaries(_circles(120, 0), k=50, K=6, n_parts=3)


def test_landmark_subsamples_keep_exact_h0_with_full_h0():
    """The reference-scale setting: H1 on landmarks, H0 from each whole subsample's spanning tree (exact)."""
    from workbench.topology.persistence import rips_persistence

    cloud = _circles(240, 1, d=6)
    exact = subsample_summaries(cloud, k=60, K=4, n_parts=2, n_threads=1)
    marked = subsample_summaries(cloud, k=60, K=4, n_parts=2, n_threads=1, landmarks=20, full_h0=True)
    coarse = subsample_summaries(cloud, k=60, K=4, n_parts=2, n_threads=1, landmarks=20)
    assert [r.tolist() for r in marked.rows] == [r.tolist() for r in exact.rows]  # the same subsamples
    h0 = [i for i, n in enumerate(exact.names) if n.startswith("h0_")]
    np.testing.assert_allclose(marked.features[:, h0], exact.features[:, h0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(coarse.features[:, h0], exact.features[:, h0], atol=1e-3)  # landmark H0 is coarser
    assert (marked.hausdorff > 0).all()
    one = rips_persistence(cloud[marked.rows[0]], maxdim=1, landmarks=20, full_h0=True)
    assert len(one.dgms[0]) == 60 and one.extras["h0"] == "full cloud"


def test_compare_conditions_finds_the_layer_that_differs():
    rng = np.random.default_rng(4)
    same = rng.standard_normal((160, 4))
    clouds = {
        "L0": (same[:80], same[80:]),  # one distribution for both conditions
        "L1": (_circles(80, 5), rng.standard_normal((80, 4)) * 0.6),  # loops vs blob
    }
    res = compare_conditions(clouds, k=30, K=8, n_parts=2, n_boot=100, n_perm=200, n_threads=1)
    assert res.g.shape == res.q_perm.shape == (2, 62)
    assert res.auc_topology[1] > 0.9
    assert res.auc_topology[0] < 0.9
    h1_count = res.names.index("h1_count")
    assert res.q_perm[1, h1_count] < 0.05
    assert res.top(3)[0]["layer"] == "L1"
    assert res.auc_probe_rows.shape == (2,) and res.auc_probe_means.shape == (2,)


def test_cv_auc_needs_two_classes_and_uses_groups():
    X = np.random.default_rng(6).standard_normal((40, 3))
    y = np.r_[np.zeros(20), np.ones(20)]
    X[y == 1, 0] += 3
    out = cv_auc(X, y, groups=np.tile(np.arange(4), 10), n_splits=4)
    assert out["auc"] > 0.9 and len(out["folds"]) == 4
    with pytest.raises(WorkbenchError, match="two conditions"):
        cv_auc(X, np.zeros(40))


def test_part_level_test_is_honest_and_still_finds_a_real_difference():
    """Per-part means are the independent units: a true difference survives, the null gives few small p."""
    from workbench.topology.stats import part_means

    f = np.arange(12, dtype=float).reshape(6, 2)
    assert np.allclose(part_means(f, np.array([0, 1, 0, 1, 0, 1])), [[4, 5], [6, 7]])
    rng = np.random.default_rng(7)
    same = rng.standard_normal((240, 4))
    clouds = {"L0": (same[:120], same[120:]), "L1": (_circles(120, 5), rng.standard_normal((120, 4)) * 0.6)}
    res = compare_conditions(clouds, k=24, K=16, n_parts=4, n_boot=50, n_perm=200, n_threads=1)
    assert res.p_parts.shape == res.q_parts.shape == (2, 62)
    assert res.p_parts[1, res.names.index("h1_count")] < 0.05
    tested = res.p_parts[0][res.p_parts[0] < 1]  # constant features give p = 1
    assert (tested < 0.01).mean() < 0.1


def test_benjamini_hochberg_leaves_nan_out_of_the_count():
    p = np.array([[0.001, np.nan], [0.02, 0.04]])
    q = benjamini_hochberg(p)
    assert np.isnan(q[0, 1])
    assert np.allclose(q[np.isfinite(p)], benjamini_hochberg(np.array([0.001, 0.02, 0.04])))


def test_an_untestable_signature_feature_is_not_significant():
    from workbench.probe import signature_agreement

    verdicts = signature_agreement(["h0_death_mean", "h1_count"], g=[2.0, -3.0], q=[float("nan"), 0.01])
    assert verdicts == {"h0_death_mean": "n.s.", "h1_count": "agrees"}
