"""Sparse (Tactic) vs full decode attention time on the CPU at 2k / 4k / 8k context, as ratios in one run.

    python bench/bench_attention.py [--model smollm2-135m|synthetic] [--layer 14] [--contexts 2048 4096 8192]

Queries, keys and values are those of one layer of the model on held-out text: one chunked
prefill of the longest context gives, for a context n, the keys and values of positions
< n and the query of position n - 1 (exactly what decoding token n - 1 sees, by causality).
Times are single-query attention per layer, all heads, median of repeats; the Tactic time
includes its selection (cluster ranking, sampled fit, progressive scoring), not the
prefill clustering, which is reported separately; "selected only" is the attention over the
chosen keys alone (what a fused kernel would pay beyond the selection). Writes bench/results/attention.json.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from workbench.kernels import attention as ka

from workbench.report import versions
from workbench.tools import sparse_attention as sa
from workbench.tools.decoding import new_cache


def model_qkv(model_name: str, layer: int, n: int, chunk: int = 512):
    """Rotated queries ``[n, h, d]``, keys and values ``[n, kv, d]`` of ``layer`` on ``n`` held-out tokens."""
    from workbench.data.corpus import token_blocks
    from workbench.models import load_model

    model = load_model(model_name)
    tokens = token_blocks(model.tokenizer, n, n, split="heldout", seed=0)
    got = {"q": [], "v": []}

    def grab(x, hook):
        name = hook.name.rsplit(".", 1)[-1]
        if name == "hook_rot_k":
            got["k"] = x[0].clone()
        else:
            got["q" if name == "hook_rot_q" else "v"].append(x[0].clone())
        return x

    cache = new_cache(model, 1)
    names = [f"blocks.{layer}.attn.{h}" for h in ("hook_rot_q", "hook_rot_k", "hook_v")]
    with torch.inference_mode(), model.hooks(fwd_hooks=[(nm, grab) for nm in names]):
        for start in range(0, n, chunk):
            model(tokens[:, start : start + chunk], past_kv_cache=cache, stop_at_layer=layer + 1)
    return torch.cat(got["q"]), got["k"], torch.cat(got["v"])


def synthetic_qkv(n: int, h: int = 9, kv: int = 3, d: int = 64, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(n // 16, d, generator=gen) * 2
    k = centers[torch.randint(0, len(centers), (n, kv), generator=gen)] + 0.5 * torch.randn(n, kv, d, generator=gen)
    q = centers[torch.randint(0, len(centers), (n, h), generator=gen)] * 0.7
    return q, k, torch.randn(n, kv, d, generator=gen)


def median_time(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="a model name, or 'synthetic' for clustered random data")
    parser.add_argument("--layer", type=int, default=14)
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--queries", type=int, default=4, help="query positions per context (the last ones)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--p", type=float, default=0.9)
    parser.add_argument("--out", default=str(Path(__file__).with_name("results") / "attention.json"))
    args = parser.parse_args()

    longest = max(args.contexts)
    if args.model == "synthetic":
        q_all, k_all, v_all = synthetic_qkv(longest)
    else:
        q_all, k_all, v_all = model_qkv(args.model, args.layer, longest)
    tactic = sa.Tactic(args.p)
    rows = []
    for n in args.contexts:
        t0 = time.perf_counter()
        cent, members = ka.cluster_members(k_all[: n - args.queries])
        cluster_s = time.perf_counter() - t0
        full_t, sparse_t, selected_t, loaded, errs = [], [], [], [], []
        for pos in range(n - args.queries, n):
            # keys clustered at prefill; the few decoded since are attended in full by Tactic, left out here
            q, k, v = q_all[pos], k_all[: n - args.queries], v_all[: n - args.queries]
            dense = ka.decode_attention(q, k, v)
            out, mask = ka.tactic_decode_attention(q, k, v, cent, members, tactic)
            full_t.append(median_time(lambda q=q, k=k, v=v: ka.decode_attention(q, k, v), args.repeats))
            sparse_t.append(median_time(
                lambda q=q, k=k, v=v, c=cent, m=members: ka.tactic_decode_attention(q, k, v, c, m, tactic),
                args.repeats))
            selected_t.append(median_time(
                lambda q=q, k=k, v=v, m=mask: ka.sparse_decode_attention(q, k, v, m), args.repeats))
            loaded.append(mask.float().mean().item())
            errs.append(((out - dense).norm() / dense.norm()).item())
        f, s, o = statistics.median(full_t), statistics.median(sparse_t), statistics.median(selected_t)
        rows.append({"context": n, "full_ms": f * 1e3, "tactic_ms": s * 1e3, "ratio_tactic_over_full": s / f,
                     "selected_only_ms": o * 1e3, "ratio_selected_only_over_full": o / f,
                     "loaded": sum(loaded) / len(loaded), "out_err": sum(errs) / len(errs),
                     "prefill_clustering_s": cluster_s})

    print(f"{args.model} layer {args.layer}, P={args.p}, {torch.get_num_threads()} thread(s)")
    print(f"{'context':>7} {'full ms':>8} {'tactic ms':>9} {'ratio':>6} {'sel-only ms':>11} {'ratio':>6} "
          f"{'loaded':>7} {'out_err':>8} {'cluster s':>9}")
    for r in rows:
        print(f"{r['context']:>7} {r['full_ms']:8.3f} {r['tactic_ms']:9.3f} {r['ratio_tactic_over_full']:6.2f} "
              f"{r['selected_only_ms']:11.3f} {r['ratio_selected_only_over_full']:6.2f} "
              f"{r['loaded']:7.3f} {r['out_err']:8.4f} {r['prefill_clustering_s']:9.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "layer": args.layer, "p": args.p, "queries": args.queries,
                               "repeats": args.repeats, "versions": versions(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
