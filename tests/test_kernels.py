"""Distance kernels against a float64 reference, on offset data, dense, tiled and sparse."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist
from workbench.kernels import iter_distance_blocks, knn, pairwise_distances, radius_edges

from workbench.errors import WorkbenchError

METRICS = ["euclidean", "sqeuclidean", "cosine"]


def _ref(X, Y, metric):
    return cdist(X.astype(np.float64), Y.astype(np.float64), metric)


def _cloud(n, d, offset=0.0, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d)) + offset).astype(np.float32)


def _tol(ref, metric):
    # float32 of a unit-variance cloud: errors of a few ulps of the largest entry
    return 1e-5 * max(1.0, float(np.abs(ref).max()))


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_self_distances_match_float64_and_are_exactly_symmetric(metric, offset):
    X = _cloud(130, 17, offset)
    D = pairwise_distances(X, metric=metric, block_size=48)  # several blocks, ragged last one
    ref = _ref(X, X, metric)
    assert D.dtype == np.float32
    assert np.abs(D - ref).max() <= _tol(ref, metric)
    assert np.array_equal(D, D.T)
    assert np.all(np.diag(D) == 0)


def test_offset_data_beats_torch_cdist():
    X = _cloud(200, 64, 1e4)
    ref = _ref(X, X, "euclidean")
    ours = np.abs(pairwise_distances(X) - ref).max()
    theirs = np.abs(torch.cdist(torch.from_numpy(X), torch.from_numpy(X)).numpy() - ref).max()
    assert ours < 1e-3
    assert ours * 100 < theirs  # cdist's Gram path cancels catastrophically here


@pytest.mark.parametrize("metric", METRICS)
def test_cross_distances_torch_input_gives_tensor(metric):
    X, Y = _cloud(40, 9, 5.0, 1), _cloud(23, 9, 5.0, 2)
    D = pairwise_distances(torch.from_numpy(X), torch.from_numpy(Y), metric=metric, block_size=16)
    assert isinstance(D, torch.Tensor) and D.shape == (40, 23)
    ref = _ref(X, Y, metric)
    assert np.abs(D.numpy() - ref).max() <= _tol(ref, metric)


def test_float64_input_stays_float64_and_is_accurate():
    X = _cloud(50, 5, 1e6).astype(np.float64)
    D = pairwise_distances(X)
    assert D.dtype == np.float64
    np.testing.assert_allclose(D, cdist(X, X), atol=1e-6)


def test_blocks_reassemble_the_dense_matrix():
    X = _cloud(77, 6, 100.0)
    dense = pairwise_distances(X)
    pieces = np.concatenate([b.numpy() for _, _, b in iter_distance_blocks(X, block_size=20)])
    np.testing.assert_allclose(pieces, dense, atol=1e-4)
    assert np.all(np.diag(pieces) == 0)


def test_radius_edges_are_the_pairs_below_threshold():
    X = _cloud(90, 3, 0.0, 3)
    ref = _ref(X, X, "euclidean")
    r = float(np.quantile(ref[np.triu_indices(90, 1)], 0.1))
    i, j, d = radius_edges(X, r, block_size=32)
    assert np.all(i < j)
    expected = {(a, b) for a, b in zip(*np.nonzero(np.triu(ref <= r, 1)), strict=True)}
    got = set(zip(i.tolist(), j.tolist(), strict=True))
    # pairs within float32 rounding of the threshold may go either way
    borderline = {(a, b) for a, b in expected ^ got if abs(ref[a, b] - r) < 1e-4}
    assert expected ^ got == borderline
    np.testing.assert_allclose(d, ref[i, j], atol=1e-5)


def test_knn_excludes_self_and_matches_reference():
    X = _cloud(60, 4, 1e3, 4)
    idx, dist = knn(X, 5, block_size=25)
    ref = _ref(X, X, "euclidean")
    np.fill_diagonal(ref, np.inf)
    np.testing.assert_allclose(dist, np.sort(ref, 1)[:, :5], atol=1e-3)
    assert not np.any(idx == np.arange(60)[:, None])
    with pytest.raises(WorkbenchError, match="candidates"):
        knn(X, 60)


def test_bad_inputs_raise_workbench_errors():
    with pytest.raises(WorkbenchError, match="2-D"):
        pairwise_distances(np.zeros(5))
    with pytest.raises(WorkbenchError, match="metric"):
        pairwise_distances(np.zeros((3, 2)), metric="manhattan")
    with pytest.raises(WorkbenchError, match=r"rows \[1\]"):
        pairwise_distances(np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]]), metric="cosine")
    with pytest.raises(WorkbenchError, match="dimensions"):
        pairwise_distances(np.zeros((3, 2)), np.zeros((3, 4)))


def test_forcing_triton_on_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(WorkbenchError, match="TRITON_INTERPRET"):
        pairwise_distances(np.zeros((3, 2), np.float32), backend="triton")


# Triton reads TRITON_INTERPRET when it is first imported (triton.language decorates its own
# helpers then), so the interpreter run happens in a fresh process with the variable set.
_TRITON_SCRIPT = """
import numpy as np
from scipy.spatial.distance import cdist
from workbench.kernels import pairwise_distances
rng = np.random.default_rng(5)
worst = 0.0
for metric in ("euclidean", "sqeuclidean", "cosine"):
    for n, m, d in ((70, None, 33), (130, 50, 40)):
        X = (rng.standard_normal((n, d)) + 1e4).astype(np.float32)
        Y = None if m is None else (rng.standard_normal((m, d)) + 1e4).astype(np.float32)
        D = pairwise_distances(X, Y, metric=metric, backend="triton")
        ref = cdist(X.astype(np.float64), (X if Y is None else Y).astype(np.float64), metric)
        assert D.dtype == np.float32 and D.shape == ref.shape
        err = np.abs(D - ref).max() / max(1.0, np.abs(ref).max())
        assert err < 1e-5, (metric, n, m, err)
        if Y is None:
            assert np.array_equal(D, D.T), "not symmetric"
            assert np.all(np.diag(D) == 0), "non-zero diagonal"
        worst = max(worst, err)
# tight cluster far from the mean: small distances are refined after the kernel too
X = (rng.standard_normal((1, 8)) * 100 + 1e-3 * rng.standard_normal((40, 8))).astype(np.float32)
X = np.vstack([X, rng.standard_normal((40, 8)).astype(np.float32) * 100])
D = pairwise_distances(X, backend="triton")
ref = cdist(X.astype(np.float64), X.astype(np.float64))
np.testing.assert_allclose(D[:40, :40], ref[:40, :40], rtol=1e-4, atol=1e-9)
print("ok", worst)
"""


def test_triton_kernel_in_interpreter_matches_float64():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_SCRIPT], env=env, cwd=root, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok")


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_small_distances_are_accurate_in_tight_far_clusters(metric):
    # clusters of radius ~1e-3 (cosine: 1e-1) around centres ~100 apart: the Gram form alone
    # is off by ~1e-2 here; cosine is limited by float32 normalisation at smaller angles
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((4, 16)) * 100
    spread = 1e-3 if metric == "euclidean" else 1e-1
    X = (centres.repeat(25, axis=0) + spread * rng.standard_normal((100, 16))).astype(np.float32)
    X[10] = X[11]  # an exact duplicate
    D = pairwise_distances(X, metric=metric, block_size=32)
    ref = _ref(X, X, metric)
    assert D[10, 11] == 0 and D[11, 10] == 0
    close = (ref > 0) & (ref < np.quantile(ref[ref > 0], 0.2))
    np.testing.assert_allclose(D[close], ref[close], rtol=1e-4, atol=1e-12)
    blocks = np.concatenate([b.numpy() for _, _, b in iter_distance_blocks(X, metric=metric, block_size=32)])
    np.testing.assert_allclose(blocks[close], ref[close], rtol=1e-4, atol=1e-12)


def test_a_far_outlier_does_not_send_every_pair_to_refinement(monkeypatch):
    """Token activations have a few points far out; the refinement bound is per pair, so the bulk stays on the
    GEMM (a per-row bound with the largest norm refined 98% of a 4096-point matrix: 18 s instead of 0.1 s),
    and the close pairs are still refined to float64 accuracy."""
    from workbench.kernels import distances as kd

    rng = np.random.default_rng(11)
    X = (rng.standard_normal((1000, 32)) * 3).astype(np.float32)
    X[5] = X[6] + 1e-3  # a near-duplicate the Gram form gets wrong
    X[0] *= 30  # one far outlier
    refined = []
    real = kd._refine

    def counting(sq, xs, ys, diag=None):
        before = sq.clone()
        out = real(sq, xs, ys, diag)
        refined.append(int((out != before).sum()))
        return out

    monkeypatch.setattr(kd, "_refine", counting)
    D = pairwise_distances(X)
    ref = _ref(X, X, "euclidean")
    assert sum(refined) < 0.05 * X.shape[0] ** 2
    np.testing.assert_allclose(D[5, 6], ref[5, 6], rtol=1e-3)
    np.testing.assert_allclose(D, ref, rtol=1e-4, atol=1e-3)


def test_triton_kernel_compiles_for_h100_without_a_gpu():
    pytest.importorskip("triton")
    script = (
        "from workbench.kernels.triton_distances import compile_for\n"
        "c = compile_for(90)\n"
        "assert len(c.asm['cubin']) > 1000 and '.target sm_90' in c.asm['ptx']\n"
        "print('ok')\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
