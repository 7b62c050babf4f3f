"""The reference study's topology protocol at its own scale, one layer: K = 64 subsamples of k = 4096 points per
class, H0 + H1, on 2 cores, against giotto-ph exact on the same clouds.

    python bench/bench_reference_topology.py [--model smollm2-135m] [--layer 15] [--landmarks 256 512]
                                             [--exact 2] [--quick]

The two classes are token activations (``blocks.{layer}.hook_resid_post``, BOS left out) of held-out and
training-split corpus text: the cost and the error of the protocol, not a finding. Each subsample's H0 is exact
(its minimum spanning tree, ``full_h0``); H1 is Rips on ``m`` random landmarks, whose Hausdorff distance to
the subsample bounds the H1 bottleneck error by 2 dH. On ``--exact`` subsamples of the first class, giotto-ph
computes the exact H0 and H1 of all k points: its time per subsample against ours, and the bottleneck distance
between the diagrams actually measured. Writes bench/results/reference_topology.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchutil import peak_rss_mb, print_table, write_results  # noqa: E402


def token_cloud(model, layer: int, n_points: int, split: str, block: int = 512) -> np.ndarray:
    """``n_points`` token activations of ``layer`` on corpus text of ``split``, BOS positions left out."""
    import torch

    from workbench.data.corpus import token_blocks

    per_block = block - 1
    tokens = token_blocks(model.tokenizer, -(-n_points // per_block) * block, block, split=split, seed=0)
    site = f"blocks.{layer}.hook_resid_post"
    out = []
    with torch.inference_mode():
        for row in tokens:
            _, cache = model.run_with_cache(row[None], names_filter=[site], stop_at_layer=layer + 1)
            out.append(cache[site][0, 1:].float().numpy())
    return np.concatenate(out)[:n_points]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--layer", type=int, default=15)
    p.add_argument("--k", type=int, default=4096, help="points per subsample")
    p.add_argument("--K", type=int, default=64, help="subsamples per class")
    p.add_argument("--parts", type=int, default=4, help="disjoint row parts per class (the CV folds)")
    p.add_argument("--landmarks", type=int, nargs="+", default=[256, 512])
    p.add_argument("--exact", type=int, default=2, help="subsamples checked against giotto-ph exact")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="k = 1024, K = 8, one exact check")
    args = p.parse_args()
    if args.quick:
        args.k, args.K, args.exact, args.landmarks = 1024, 8, 1, [256]

    import gudhi
    import torch
    from gph import ripser_parallel

    from workbench.models import load_model
    from workbench.topology.persistence import rips_persistence
    from workbench.topology.stats import subsample_summaries

    torch.set_num_threads(args.threads)
    model = load_model(args.model, dtype="float32")
    t0 = time.perf_counter()
    clouds = [token_cloud(model, args.layer, args.k * args.parts, split) for split in ("heldout", "train")]
    capture_s = time.perf_counter() - t0
    print(f"{args.model} layer {args.layer}: 2 classes x {len(clouds[0])} tokens in {capture_s:.1f} s")

    rows = []
    for m in args.landmarks:
        t0 = time.perf_counter()
        subs = [subsample_summaries(c, args.k, args.K, n_parts=args.parts, maxdim=1, landmarks=m,
                                    n_threads=args.threads, full_h0=True) for c in clouds]
        protocol_s = time.perf_counter() - t0
        exact_s, ours_s, b0, b1, scale = [], [], [], [], []
        for idx in subs[0].rows[: args.exact]:
            X = clouds[0][idx]
            t1 = time.perf_counter()
            ours = rips_persistence(X, maxdim=1, landmarks=m, n_threads=args.threads, full_h0=True)
            ours_s.append(time.perf_counter() - t1)
            t1 = time.perf_counter()
            full = ripser_parallel(X, maxdim=1, n_threads=args.threads)["dgms"]
            exact_s.append(time.perf_counter() - t1)
            fin = [np.asarray(d, np.float64)[np.isfinite(np.asarray(d)[:, 1])] for d in full]
            mine = [np.asarray(d, np.float64)[np.isfinite(np.asarray(d)[:, 1])] for d in ours.dgms]
            b0.append(gudhi.bottleneck_distance(mine[0], fin[0]))
            b1.append(gudhi.bottleneck_distance(mine[1], fin[1]))
            scale.append(float((fin[1][:, 1] - fin[1][:, 0]).max(initial=0)))
        per_sub = protocol_s / (2 * args.K)
        rows.append({
            "k": args.k, "K": args.K, "landmarks": m, "protocol_s": protocol_s, "budget_s": 120.0,
            "x_budget": protocol_s / 120.0, "per_subsample_s": per_sub,
            "ours_on_exact_sample_s": statistics.mean(ours_s), "giotto_exact_s": statistics.mean(exact_s),
            "x_giotto": statistics.mean(exact_s) / per_sub,
            "hausdorff_mean": float(np.mean(np.concatenate([s.hausdorff for s in subs]))),
            "bound_h1_2dH": 2 * float(np.mean(np.concatenate([s.hausdorff for s in subs]))),
            "bottleneck_h0": max(b0), "bottleneck_h1": max(b1), "max_h1_persistence_exact": max(scale),
            "protocol_giotto_exact_est_s": statistics.mean(exact_s) * 2 * args.K,
        })
    print("x_budget: protocol time / the 120 s target; x_giotto: giotto-ph exact time / ours, per subsample; "
          "bottleneck_*: measured against giotto-ph exact on the checked subsamples (worst)")
    print_table(rows, ["k", "K", "landmarks", "protocol_s", "x_budget", "per_subsample_s", "giotto_exact_s",
                       "x_giotto", "bound_h1_2dH", "bottleneck_h0", "bottleneck_h1", "max_h1_persistence_exact"])
    write_results("reference_topology" + ("_quick" if args.quick else ""), args, rows, peak_rss_mb=peak_rss_mb(),
                  capture_s=capture_s, model=args.model, layer=args.layer)


if __name__ == "__main__":
    main()
