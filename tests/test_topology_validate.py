"""Bad input gives one clear WorkbenchError, never a NaN diagram, a MemoryError or an overflow."""

import logging

import numpy as np
import pytest

from workbench.errors import WorkbenchError
from workbench.topology.persistence import alpha_persistence, h0_persistence, rips_persistence
from workbench.topology.validate import as_points


@pytest.mark.parametrize(
    ("points", "match"),
    [
        (np.zeros((2, 3)), "2 point"),
        (np.zeros((5, 0)), "zero-dimensional"),
        (np.arange(5.0), "2-D"),
        (np.zeros((2, 3, 4)), "2-D"),
        (np.ones((10, 3)), "constant"),
        (np.array([[0.0, 0], [0, 0], [1, 1], [1, 1]]), "2 distinct"),
        (np.array([["a", "b"], ["c", "d"], ["e", "f"]]), "numeric"),
    ],
)
def test_bad_shapes_and_degenerate_clouds(points, match):
    with pytest.raises(WorkbenchError, match=match):
        as_points(points)
    with pytest.raises(WorkbenchError, match=match):
        rips_persistence(points)


def test_non_finite_rows_are_named():
    X = np.random.default_rng(0).standard_normal((20, 3))
    X[3, 1] = np.nan
    X[17, 0] = np.inf
    with pytest.raises(WorkbenchError, match=r"2 row\(s\): 3, 17"):
        rips_persistence(X)
    X = np.full((30, 2), np.nan)
    with pytest.raises(WorkbenchError, match="and 20 more"):
        h0_persistence(X)


def test_duplicates_are_logged_and_change_nothing(caplog):
    X = np.random.default_rng(1).standard_normal((40, 2))
    with caplog.at_level(logging.INFO):
        dup = rips_persistence(np.vstack([X, X[:7]]))
    assert "7 duplicate rows" in caplog.text
    ref = rips_persistence(X)
    for a, b in zip(dup.dgms, ref.dgms, strict=True):
        np.testing.assert_allclose(np.sort(a, 0), np.sort(b, 0), atol=1e-6)
    assert alpha_persistence(np.vstack([X, X[:7]])).dgms[1].shape == alpha_persistence(X).dgms[1].shape


def test_integer_and_tensor_inputs_are_accepted():
    torch = pytest.importorskip("torch")
    X = np.array([[0, 0], [0, 3], [4, 0], [4, 3]])
    assert rips_persistence(X).dgms[0][:, 1].max() == np.inf
    assert rips_persistence(torch.tensor(X, dtype=torch.float32), maxdim=0).n_points == 4


def test_too_large_for_full_rips_proposes_landmarks_or_threshold():
    X = np.random.default_rng(2).standard_normal((7000, 2)).astype(np.float32)
    with pytest.raises(WorkbenchError, match="landmarks=.*thresh"):
        rips_persistence(X, maxdim=1)
    with pytest.raises(WorkbenchError, match="H2"):
        rips_persistence(X[:1000], maxdim=2)
    # H0 alone never needs the full complex
    assert rips_persistence(X, maxdim=0).dgms[0].shape[0] >= 1


def test_invalid_parameters():
    X = np.random.default_rng(3).standard_normal((20, 3))
    with pytest.raises(WorkbenchError, match="maxdim"):
        rips_persistence(X, maxdim=-1)
    with pytest.raises(WorkbenchError, match="backend"):
        rips_persistence(X, backend="cuda-magic")
    with pytest.raises(WorkbenchError, match="landmarks"):
        rips_persistence(X, landmarks=0)
    with pytest.raises(WorkbenchError, match="metric"):
        rips_persistence(X, metric="hamming")
    with pytest.raises(WorkbenchError, match="square"):
        rips_persistence(X, distance_matrix=True)


def test_index_overflow_is_refused_even_with_a_threshold():
    X = np.random.default_rng(4).standard_normal((1_000_000, 2)).astype(np.float32)
    with pytest.raises(WorkbenchError, match="overflow"):
        rips_persistence(X, maxdim=2, thresh=0.01)
