"""Rips H1 of a 4096-point cloud in 576 dims: ours (landmarks + threads, error bound stated)
vs giotto-ph and ripser on the full cloud.

    python bench/bench_h1.py                      # n=4096, landmarks 512 and 1024
    python bench/bench_h1.py --quick              # n=1024, landmarks 256
    python bench/bench_h1.py --data isotropic     # the hard case (every distance alike)

Ratios are baseline time / our time. Beside each landmark run: the Hausdorff distance to
the landmarks, the bottleneck bound 2*dH it implies, and the bottleneck distance to the
full giotto-ph H0/H1 diagrams actually measured in this run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchutil import best_of, peak_rss_mb, print_table, write_results  # noqa: E402


def cloud(n: int, d: int, kind: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "isotropic":
        return rng.standard_normal((n, d)).astype(np.float32)
    # activation-like: a 16-dimensional signal in d dims plus small isotropic noise and an offset
    Z = rng.standard_normal((n, 16)) @ rng.standard_normal((16, d)) / 4
    return (Z + 0.1 * rng.standard_normal((n, d)) + 3.0).astype(np.float32)


def finite(dgm: np.ndarray) -> np.ndarray:
    return dgm[np.isfinite(dgm[:, 1])]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--d", type=int, default=576)
    p.add_argument("--landmarks", type=int, nargs="+", default=None)
    p.add_argument("--data", choices=["lowrank", "isotropic"], default="lowrank")
    p.add_argument("--methods", nargs="+", default=["maxmin", "random"], help="landmark choice")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-ripser", action="store_true", help="ripser on the full cloud is the slowest part")
    args = p.parse_args()
    n = args.n or (1024 if args.quick else 4096)
    marks = args.landmarks or ([256] if args.quick else [512, 1024])

    import gudhi
    import torch
    from gph import ripser_parallel
    from ripser import ripser

    from workbench.topology.persistence import rips_persistence

    torch.set_num_threads(args.threads)
    X = cloud(n, args.d, args.data)
    t_gph, full = best_of(lambda: ripser_parallel(X, maxdim=1, n_threads=args.threads)["dgms"])
    t_rip = None
    if not args.skip_ripser:
        t_rip, _ = best_of(lambda: ripser(X, maxdim=1)["dgms"])
    rows = []
    for m, method in [(m, meth) for m in marks for meth in args.methods]:
        t_ours, res = best_of(
            lambda m=m, method=method: rips_persistence(
                X, maxdim=1, landmarks=m, landmark_method=method, n_threads=args.threads
            )
        )
        measured = [gudhi.bottleneck_distance(finite(a), finite(np.asarray(b, np.float64)))
                    for a, b in zip(res.dgms, full, strict=True)]  # fmt: skip
        row = {
            "n": n, "d": args.d, "data": args.data, "landmarks": m, "method": method,
            "ours_s": t_ours, "giotto_full_s": t_gph, "ripser_full_s": t_rip,
            "x_giotto": t_gph / t_ours, "x_ripser": (t_rip / t_ours) if t_rip else None,
            "hausdorff": res.hausdorff, "bound_2dH": res.bottleneck_bound,
            "bottleneck_h0": measured[0], "bottleneck_h1": measured[1],
            "h1_bars_ours": len(res.dgms[1]), "h1_bars_full": len(full[1]),
            "max_h1_death_full": float(finite(np.asarray(full[1], np.float64))[:, 1].max(initial=0)),
        }  # fmt: skip
        rows.append(row)
        print_table([row], list(row))
    print()
    print(
        "ratios are baseline time / our time (> 1 means ours is faster); bottleneck_* measured against giotto-ph full"
    )
    print_table(rows, ["n", "landmarks", "method", "ours_s", "giotto_full_s", "ripser_full_s", "x_giotto", "x_ripser",
                       "bound_2dH", "bottleneck_h0", "bottleneck_h1", "max_h1_death_full"])  # fmt: skip
    write_results(
        f"bench_h1_{args.data}" + ("_quick" if args.quick else ""), args, rows, peak_rss_mb=peak_rss_mb()
    )


if __name__ == "__main__":
    main()
