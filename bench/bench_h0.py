"""H0 persistence: minimum spanning tree vs ripser(maxdim=0), and H0 of a big cloud without n^2 memory.

    python bench/bench_h0.py            # n in {1000, 4000, 8000} at d=576, then n=50000
    python bench/bench_h0.py --quick    # n in {1000, 2000}, then n=10000

Two comparisons per n, both on the same float32 cloud: from a precomputed distance matrix
(our dense Prim vs ripser on the same matrix; the reference facts' setting) and end to end
from the points (our distances + MST vs ripser computing its own distances). Ratios are
ripser time / our time. Deaths are checked to agree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchutil import best_of, peak_rss_mb, print_table, write_results  # noqa: E402


def cloud(n: int, d: int, seed: int = 0) -> np.ndarray:
    """Anisotropic Gaussian (spectrum ~ 1/sqrt(i)) with an offset, like residual-stream activations."""
    rng = np.random.default_rng(seed)
    scales = 1 / np.sqrt(np.arange(1, d + 1))
    return (rng.standard_normal((n, d)) * scales + 3.0).astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sizes", type=int, nargs="+", default=None)
    p.add_argument("--big", type=int, default=None, help="n of the no-n^2 run (0 to skip)")
    p.add_argument("--d", type=int, default=576)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    sizes = args.sizes or ([1000, 2000] if args.quick else [1000, 4000, 8000])
    big = args.big if args.big is not None else (10000 if args.quick else 50000)

    import torch
    from ripser import ripser
    from workbench.kernels import pairwise_distances

    from workbench.topology.persistence import h0_persistence, mst_weights_blocked, mst_weights_dense

    torch.set_num_threads(args.threads)
    big_row = None
    if big:  # first, so that the peak memory it reports is its own
        X = cloud(big, args.d, seed=1)
        rss_before = peak_rss_mb()
        t_big, dgm = best_of(lambda: h0_persistence(X, method="blocked"))
        big_row = {
            "n": big, "d": args.d, "blocked_s": t_big, "bars": len(dgm),
            "peak_rss_mb": peak_rss_mb(), "rss_before_mb": rss_before,
            "dense_matrix_would_be_mb": big * big * 4 / 2**20,
        }  # fmt: skip
        print_table([big_row], list(big_row))
    pairwise_distances(cloud(256, args.d))  # warm up torch's thread pool
    rows = []
    for n in sizes:
        X = cloud(n, args.d)
        t_dist, D = best_of(lambda X=X: pairwise_distances(X))
        t_prim, ours = best_of(lambda D=D: mst_weights_dense(D))
        t_rip_D, ref = best_of(lambda D=D: ripser(D, maxdim=0, distance_matrix=True)["dgms"][0])
        t_rip_X, _ = best_of(lambda X=X: ripser(X, maxdim=0)["dgms"][0])
        t_blocked, blocked = best_of(lambda X=X: mst_weights_blocked(X))
        ref_deaths = np.sort(ref[np.isfinite(ref[:, 1]), 1])
        err = float(np.abs(np.sort(ours)[-len(ref_deaths) :] - ref_deaths).max())
        err_blocked = float(np.abs(np.sort(blocked) - np.sort(ours)).max())
        row = {
            "n": n, "d": args.d,
            "dist_s": t_dist, "prim_s": t_prim, "blocked_s": t_blocked,
            "ripser_D_s": t_rip_D, "ripser_X_s": t_rip_X,
            "x_from_matrix": t_rip_D / t_prim,
            "x_end_to_end": t_rip_X / (t_dist + t_prim),
            "x_blocked_end_to_end": t_rip_X / t_blocked,
            "max_death_diff": err, "blocked_vs_dense": err_blocked,
        }  # fmt: skip
        rows.append(row)
        print_table([row], list(row))
        del D
    print()
    print("ratios are ripser time / our time (> 1 means ours is faster)")
    print_table(rows, ["n", "prim_s", "ripser_D_s", "x_from_matrix", "dist_s", "ripser_X_s", "x_end_to_end",
                       "x_blocked_end_to_end", "max_death_diff"])  # fmt: skip
    write_results("bench_h0" + ("_quick" if args.quick else ""), args, rows, big=big_row)


if __name__ == "__main__":
    main()
