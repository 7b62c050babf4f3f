"""Dense self-distance matrices: ours vs torch.cdist, sklearn and a bare matmul of the same shape.

    python bench/bench_distances.py            # n=10000, d in {576, 4096}
    python bench/bench_distances.py --quick    # n=2000

Ratios are baseline time / our time (> 1: we are faster). Accuracy is the largest error
against a float64 direct-difference reference on sampled rows, on the same cloud offset by
``--offset`` from the origin (activations have large common means).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchutil import best_of, print_table, write_results  # noqa: E402
from workbench.kernels import pairwise_distances  # noqa: E402


def reference_rows(X: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    X64 = X.double()
    return torch.cdist(X64[rows], X64, compute_mode="donot_use_mm_for_euclid_dist")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="n=2000 instead of 10000")
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--dims", type=int, nargs="+", default=[576, 4096])
    p.add_argument("--offset", type=float, default=10.0)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-sklearn", action="store_true")
    args = p.parse_args()
    n = args.n or (2000 if args.quick else 10000)
    repeats = args.repeats or (3 if args.quick else 1)
    torch.set_num_threads(args.threads)
    from sklearn.metrics import pairwise_distances as sk_pairwise

    rows = []
    for d in args.dims:
        gen = torch.Generator().manual_seed(d)
        X = torch.randn(n, d, generator=gen) + args.offset
        sample = torch.randperm(n, generator=gen)[:32]
        ref = reference_rows(X, sample)
        candidates = {
            "ours": lambda X=X: pairwise_distances(X),
            "torch.cdist": lambda X=X: torch.cdist(X, X),
            "matmul": lambda X=X: X @ X.T,
        }
        if not args.no_sklearn:
            candidates["sklearn"] = lambda X=X: torch.from_numpy(sk_pairwise(X.numpy(), n_jobs=1))
        times, errors = {}, {}
        for name, fn in candidates.items():
            t, D = best_of(fn, repeats, warmup=args.quick)
            times[name] = t
            if name != "matmul":
                errors[name] = float((D[sample].double() - ref).abs().max())
            del D
        row = {
            "n": n, "d": d, "offset": args.offset,
            "ours_s": times["ours"],
            "cdist_s": times["torch.cdist"],
            "matmul_s": times["matmul"],
            "sklearn_s": times.get("sklearn"),
            "x_cdist": times["torch.cdist"] / times["ours"],
            "x_matmul": times["matmul"] / times["ours"],
            "x_sklearn": times["sklearn"] / times["ours"] if "sklearn" in times else None,
            "err_ours": errors["ours"],
            "err_cdist": errors["torch.cdist"],
            "err_sklearn": errors.get("sklearn"),
        }  # fmt: skip
        rows.append(row)
        print_table([row], list(row))
    print()
    print("ratios are baseline time / our time (> 1 means ours is faster); err = max |D - float64 ref|")
    print_table(
        rows, ["n", "d", "ours_s", "x_cdist", "x_matmul", "x_sklearn", "err_ours", "err_cdist", "err_sklearn"]
    )
    write_results("bench_distances" + ("_quick" if args.quick else ""), args, rows)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
