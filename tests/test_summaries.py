"""Summaries: named barcode features, gudhi vectorisers as estimators, diagram distances."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline

from workbench.errors import WorkbenchError
from workbench.topology.persistence import rips_persistence
from workbench.topology.summaries import (
    BarcodeSummary,
    BettiCurve,
    PersistenceImage,
    PersistenceLandscape,
    RipsPersistence,
    bottleneck_distance,
    pairwise_diagram_distances,
    persistent_entropy,
    wasserstein_distance,
)

SAMPLE = [np.array([[0.0, 1.0], [0.0, 3.0], [0.0, np.inf]]), np.array([[1.0, 2.0], [2.0, 6.0]])]


def test_barcode_summary_values_and_names():
    bs = BarcodeSummary(dims=(0, 1), quantiles=(50,)).fit([SAMPLE])
    names = list(bs.get_feature_names_out())
    assert len(names) == bs.n_features_out_ == 2 * (1 + 4 * 3 + 2)
    row = dict(zip(names, bs.transform([SAMPLE])[0], strict=True))
    assert row["h0_count"] == 2  # the infinite bar is not counted
    assert row["h0_death_mean"] == 2.0 and row["h0_death_p50"] == 2.0
    assert row["h1_persistence_mean"] == 2.5 and row["h1_persistence_std"] == 1.5
    assert row["h1_midpoint_p50"] == pytest.approx((1.5 + 4.0) / 2)
    assert row["h1_birth_mean"] == 1.5
    assert row["h1_total_persistence"] == 5.0
    p = np.array([1, 4]) / 5
    assert row["h1_entropy"] == pytest.approx(-(p * np.log(p)).sum())


def test_default_summary_has_31_features_per_dimension_and_handles_empty():
    bs = BarcodeSummary().fit([SAMPLE])
    assert bs.n_features_out_ == 62
    empty = [np.empty((0, 2)), np.empty((0, 2))]
    X = bs.transform([empty, [SAMPLE[0]]])  # second sample stops at H0
    assert np.all(np.isfinite(X)) and np.all(X[0] == 0) and np.all(X[1, 31:] == 0)


def test_entropy_is_low_when_one_bar_dominates():
    assert persistent_entropy(np.array([1.0, 1.0, 1.0, 1.0])) == pytest.approx(np.log(4))
    assert persistent_entropy(np.array([100.0, 0.01, 0.01])) < 0.01
    assert persistent_entropy(np.array([])) == 0.0


def test_estimators_follow_sklearn_conventions():
    for est in (
        BarcodeSummary(),
        BettiCurve(),
        PersistenceLandscape(),
        PersistenceImage(),
        RipsPersistence(),
    ):
        params = est.get_params()
        assert clone(est).get_params() == params
        assert est.fit([SAMPLE]) is est
        assert not any(k.endswith("_") for k in params)


def circle_cloud(seed, noise):
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, 2 * np.pi, 40)
    return np.c_[np.cos(t), np.sin(t)] + noise * rng.standard_normal((40, 2))


def test_pipeline_separates_circles_from_blobs():
    clouds = [circle_cloud(s, 0.05) for s in range(10)]
    clouds += [np.random.default_rng(100 + s).standard_normal((40, 2)) * 0.5 for s in range(10)]
    y = np.r_[np.ones(10), np.zeros(10)]
    pipe = make_pipeline(
        RipsPersistence(maxdim=1, n_threads=1), BarcodeSummary(), LogisticRegression(max_iter=2000)
    )
    assert cross_val_score(pipe, clouds, y, cv=2, scoring="roc_auc").mean() > 0.9


def test_gudhi_vectorisers_shapes_and_fitted_ranges():
    samples = [rips_persistence(circle_cloud(s, 0.05)) for s in range(3)]
    betti = BettiCurve(dim=1, resolution=50).fit(samples)
    B = betti.transform(samples)
    assert B.shape == (3, 50) and B.max() >= 1
    assert betti.get_feature_names_out()[0] == "betti_h1_0"
    land = PersistenceLandscape(dim=1, num_landscapes=2, resolution=30).fit(samples)
    assert land.transform(samples).shape == (3, 60)
    img = PersistenceImage(dim=1, resolution=(5, 4)).fit(samples)
    Im = img.transform(samples)
    assert Im.shape == (3, 20) and Im.max() > 0
    # empty diagrams vectorise to zeros without errors
    empty = [[np.empty((0, 2)), np.empty((0, 2))]]
    assert np.all(betti.transform(empty) == 0) and np.all(land.transform(empty) == 0)
    assert BettiCurve(dim=1).fit(empty).transform(empty).shape == (1, 100)


def test_diagram_distances():
    a = np.array([[0.0, 1.0], [0.0, 4.0]])
    b = np.array([[0.0, 1.0], [0.0, 3.0]])
    assert bottleneck_distance(a, a) == pytest.approx(0, abs=1e-12)
    assert bottleneck_distance(a, b) == pytest.approx(1.0)
    assert wasserstein_distance(a, b) == pytest.approx(1.0)
    # an extra bar (0, 2) is matched to the diagonal at L-inf distance 1
    c = np.vstack([a, [[0.0, 2.0]]])
    assert wasserstein_distance(a, c) == pytest.approx(1.0)
    assert bottleneck_distance(a, np.vstack([a, [[0, np.inf]]])) == np.inf
    M = pairwise_diagram_distances([[a], [b], [c]], dim=0)
    assert M.shape == (3, 3) and np.allclose(M, M.T) and M[0, 1] == pytest.approx(1.0)
    with pytest.raises(WorkbenchError):
        pairwise_diagram_distances([[a]], dim=0, metric="euclid")


def test_bad_diagrams_are_clear_errors():
    with pytest.raises(WorkbenchError, match="one diagram per dimension"):
        BarcodeSummary().fit([np.zeros((3, 2))])
    with pytest.raises(WorkbenchError, match=r"\(n, 2\)"):
        BarcodeSummary().fit([[np.zeros((3, 3))]])
