"""Sparse (Tactic) vs dense decode attention on the CPU, as ratios in one run: model keys at 2k-8k, synthetic at 32k.

    python bench/bench_attention.py [--model smollm2-135m] [--layer 14] [--contexts 2048 4096 8192]
                                    [--synthetic-contexts 8192 32768] [--p 0.9]

Model rows: queries, keys and values of one layer on held-out text; one chunked prefill of the
longest context gives, for a context n, the keys and values of positions < n and the query of
position n - 1 (exactly what decoding token n - 1 sees, by causality). Synthetic rows (clustered
random keys, the model's head shapes) go past the model's 8k context. Times are single-query
attention per layer, all heads, median of repeats, one thread:

- ``dense``: the baseline, the faster of ``torch.bmm`` over the ``[kv, n, d]`` cache and
  ``scaled_dot_product_attention`` (both timed, both reported);
- ``tactic``: the compiled CPU kernel (selection included: centroid ranking, tail samples,
  progressive scoring, attention over the chosen clusters), and the same selection in batched
  torch ops (``tactic_torch``);
- the prefill clustering (once per sequence) separately. ``loaded`` is the fraction of keys
  whose values are read, ``out_err`` the output's relative error against dense.
Writes bench/results/attention.json.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from workbench.kernels import attention as ka

from workbench.models.kv_cache import new_cache
from workbench.report import versions
from workbench.tools import sparse_attention as sa


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
    """Clustered keys and queries near some of the clusters: ``q [n, h, d]``, ``k/v [n, kv, d]``."""
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


def one_context(source: str, n: int, q_all, k_all, v_all, queries: int, repeats: int, tactic) -> dict:
    m = n - queries  # keys clustered at prefill; the few decoded since are attended in full by Tactic, left out
    k, v = k_all[:m].transpose(0, 1).contiguous(), v_all[:m].transpose(0, 1).contiguous()
    t0 = time.perf_counter()
    cache = ka.cluster_cache(k, v)
    cluster_s = time.perf_counter() - t0
    h, d = q_all.shape[1:]

    def sdpa(q):
        return F.scaled_dot_product_attention(q.reshape(1, h, 1, d), k[None], v[None], enable_gqa=True).reshape(h, d)

    methods = {"bmm": lambda q: ka.decode_attention(q, k, v), "sdpa": sdpa,
               "tactic": lambda q: ka.tactic_decode_attention(q, cache, tactic),
               "tactic_torch": lambda q: ka.tactic_decode_attention(q, cache, tactic, backend="torch")}
    t = {key: [] for key in methods}
    loaded, errs = [], []
    for pos in range(m, n):
        q = q_all[pos]
        dense = ka.decode_attention(q, k, v)
        out, chosen = ka.tactic_decode_attention(q, cache, tactic)
        for key, fn in methods.items():
            t[key].append(median_time(lambda fn=fn, q=q: fn(q), repeats))
        loaded.append(cache.loaded(chosen))
        errs.append(((out - dense).norm() / dense.norm()).item())
    ms = {key: statistics.median(v) * 1e3 for key, v in t.items()}
    dense_ms = min(ms["bmm"], ms["sdpa"])
    return {"source": source, "context": n, "dense_ms": dense_ms, "bmm_ms": ms["bmm"], "sdpa_ms": ms["sdpa"],
            "tactic_ms": ms["tactic"], "speedup_tactic_over_dense": dense_ms / ms["tactic"],
            "tactic_torch_ms": ms["tactic_torch"], "speedup_tactic_torch_over_dense": dense_ms / ms["tactic_torch"],
            "loaded": sum(loaded) / len(loaded), "out_err": sum(errs) / len(errs), "prefill_clustering_s": cluster_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="a model name for the model rows ('none' to skip them)")
    parser.add_argument("--layer", type=int, default=14)
    parser.add_argument("--contexts", type=int, nargs="*", default=[2048, 4096, 8192])
    parser.add_argument("--synthetic-contexts", type=int, nargs="*", default=[8192, 32768])
    parser.add_argument("--queries", type=int, default=4, help="query positions per context (the last ones)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--p", type=float, default=0.9)
    parser.add_argument("--out", default=str(Path(__file__).with_name("results") / "attention.json"))
    args = parser.parse_args()

    torch.set_num_threads(1)
    tactic = sa.Tactic(args.p)
    rows = []
    if args.model != "none" and args.contexts:
        qkv = model_qkv(args.model, args.layer, max(args.contexts))
        rows += [one_context(args.model, n, *qkv, args.queries, args.repeats, tactic) for n in args.contexts]
    if args.synthetic_contexts:
        qkv = synthetic_qkv(max(args.synthetic_contexts))
        rows += [one_context("synthetic", n, *qkv, args.queries, args.repeats, tactic) for n in args.synthetic_contexts]

    print(f"layer {args.layer}, P={args.p}, {torch.get_num_threads()} thread(s); speed-up = dense ms / method ms")
    print(f"{'source':>13} {'context':>7} {'bmm ms':>7} {'sdpa ms':>7} {'tactic ms':>9} {'speed-up':>8} "
          f"{'torch ms':>8} {'speed-up':>8} {'loaded':>7} {'out_err':>8} {'cluster s':>9}")
    for r in rows:
        print(f"{r['source']:>13} {r['context']:>7} {r['bmm_ms']:7.3f} {r['sdpa_ms']:7.3f} {r['tactic_ms']:9.3f} "
              f"{r['speedup_tactic_over_dense']:8.2f} {r['tactic_torch_ms']:8.3f} "
              f"{r['speedup_tactic_torch_over_dense']:8.2f} {r['loaded']:7.3f} {r['out_err']:8.4f} "
              f"{r['prefill_clustering_s']:9.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "layer": args.layer, "p": args.p, "queries": args.queries,
                               "repeats": args.repeats, "threads": torch.get_num_threads(), "versions": versions(),
                               "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
