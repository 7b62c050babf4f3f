"""Capture benchmarks on the embedded default model, as ratios against baselines measured in the same run.

1. throughput: ``capture`` (hooks, reduction, shards on disk) vs a bare forward on the same batches,
   both the full ``model(tokens)`` and one stopped at the same deepest layer;
2. memory: peak RSS of a capture of 1k vs 10k prompts (each in a fresh process), which must stay flat;
3. model load: first (GGUF dequantization, in a fresh cache) vs cached;
4. roofline: capture's effective (unpadded) model FLOP/s in float32 and bfloat16 beside this machine's own GEMM
   rate at a layer's shape, measured in the same run, as a fraction of the best dtype's GEMM rate (target >= 60%);
   "effective" counts every token of every prompt, so prefixes computed once for the rows sharing them (the
   default, ``models.kv_cache``) raise it; each dtype is also run with whole prompts (WORKBENCH_SHARED_PREFIX=0).

    python bench/bench_capture.py [--quick] [--model smollm2-135m] [--only roofline]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

MEMORY_SCRIPT = """
import resource, sys, tempfile
from workbench.models import load_model
from workbench.capture import capture, resid_sites
model = load_model(sys.argv[1], device="cpu")
n = int(sys.argv[2])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
prompts = ({"text": f"Request {i}: please summarize document number {i * 7919 % 1000}.", "label": i % 2}
           for i in range(n))
with tempfile.TemporaryDirectory() as out:
    capture(model, list(prompts), resid_sites(model, [0, 1, 2]), out, batch_size=32, progress=False)
print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def bench_throughput(model_name: str, n_prompts: int, batch_size: int) -> dict:
    import torch

    from workbench.capture import capture, resid_sites, tokenize
    from workbench.conditions.injection import generate_injection_pairs
    from workbench.models import format_chat, load_model

    model = load_model(model_name, device="cpu")
    base = generate_injection_pairs(n_prompts // 2 + 1)
    prompts = [
        dict(base[i % len(base)], text=format_chat(model, base[i % len(base)]["text"]), id=i)
        for i in range(n_prompts)
    ]
    sites = resid_sites(model)  # every layer: the probe's workload
    batches = []
    for begin in range(0, n_prompts, batch_size):
        ids, _, _ = tokenize(model, [p["text"] for p in prompts[begin : begin + batch_size]], model.cfg.n_ctx)
        tokens = torch.full((len(ids), max(map(len, ids))), model.tokenizer.pad_token_id)
        for r, row in enumerate(ids):
            tokens[r, : len(row)] = torch.tensor(row)
        batches.append(tokens)

    def bare(stop_at_layer=None):
        started = time.perf_counter()
        with torch.inference_mode():
            for tokens in batches:
                model(tokens, stop_at_layer=stop_at_layer)
        return time.perf_counter() - started

    bare(model.cfg.n_layers)  # warm-up
    timings = {"bare_full": [], "bare_stopped": [], "capture": []}
    for _ in range(2):
        timings["bare_full"].append(bare())
        timings["bare_stopped"].append(bare(model.cfg.n_layers))
        with tempfile.TemporaryDirectory() as out:
            started = time.perf_counter()
            capture(model, prompts, sites, out, batch_size=batch_size, progress=False)
            timings["capture"].append(time.perf_counter() - started)
    best = {k: min(v) for k, v in timings.items()}
    return {
        "model": model_name,
        "n_prompts": n_prompts,
        "batch_size": batch_size,
        "sites": len(sites),
        "seconds": best,
        "ratio_capture_vs_bare_full": best["capture"] / best["bare_full"],
        "ratio_capture_vs_bare_stopped": best["capture"] / best["bare_stopped"],
        "prompts_per_second": n_prompts / best["capture"],
    }


def gemm_rate(m: int, k: int, n: int, dtype, repeats: int = 5) -> float:
    """GFLOP/s of an ``[m, k] @ [k, n]`` matmul in ``dtype`` (best of ``repeats``), on the threads torch uses."""
    import torch

    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b
    best = min(_seconds(lambda: a @ b) for _ in range(repeats))
    return 2 * m * k * n / best / 1e9


def _seconds(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def forward_flops(model, lengths: list[int]) -> float:
    """Model FLOPs of forwards over prompts of these (unpadded) lengths: 2 per weight per token (the unembedding
    included, embeddings excluded) plus causal attention, 2 * 2 * d_head * heads * n(n+1)/2 per layer."""
    cfg = model.cfg
    weights = sum(p.numel() for name, p in model.named_parameters() if "embed" not in name or "unembed" in name)
    attention = sum(4 * cfg.n_layers * cfg.n_heads * cfg.d_head * n * (n + 1) / 2 for n in lengths)
    return 2.0 * weights * sum(lengths) + attention


def _capture_seconds(model, prompts: list[dict], batch_size: int) -> dict:
    """Seconds of a capture of ``prompts`` at every layer after a warm-up, with prompt prefixes computed once where
    they pay (the default, ``models.kv_cache``) and with every prompt whole, in the same run."""
    from workbench.capture import capture, resid_sites
    from workbench.models.kv_cache import SWITCH

    with tempfile.TemporaryDirectory() as warm:
        capture(model, prompts[:batch_size], resid_sites(model), warm, batch_size=batch_size, progress=False)
    seconds = {}
    for mode, value in (("prefixes", "1"), ("whole", "0")):
        os.environ[SWITCH] = value
        try:
            with tempfile.TemporaryDirectory() as folder:
                seconds[mode] = _seconds(lambda folder=folder: capture(model, prompts, resid_sites(model), folder,
                                                                        batch_size=batch_size, progress=False))
        finally:
            os.environ.pop(SWITCH)
    return seconds


def bench_roofline(model_name: str, n_prompts: int, batch_size: int) -> dict:
    """Capture's achieved FLOP/s per dtype against the GEMM rate of a layer's MLP shape in the same run."""
    import torch

    from workbench.capture import tokenize
    from workbench.conditions.injection import generate_injection_pairs
    from workbench.models import format_chat, load_model

    base = generate_injection_pairs(n_prompts // 2 + 1)
    out = {"threads": torch.get_num_threads(), "by_dtype": {}}
    for dtype in ("float32", "bfloat16"):
        model = load_model(model_name, device="cpu", dtype=dtype)
        prompts = [dict(base[i % len(base)], text=format_chat(model, base[i % len(base)]["text"]), id=i)
                   for i in range(n_prompts)]
        lengths = [len(ids) for ids in tokenize(model, [p["text"] for p in prompts], model.cfg.n_ctx)[0]]
        mean_len = round(sum(lengths) / len(lengths))
        rate = gemm_rate(batch_size * mean_len, model.cfg.d_model, model.cfg.d_mlp, getattr(torch, dtype))
        seconds = _capture_seconds(model, prompts, batch_size)
        for mode, label in (("prefixes", dtype), ("whole", f"{dtype}, whole prompts")):
            achieved = forward_flops(model, lengths) / seconds[mode] / 1e9
            out["by_dtype"][label] = {
                "gemm_gflops": rate, "capture_gflops": achieved, "fraction_of_own_gemm": achieved / rate,
                "tokens_per_second": sum(lengths) / seconds[mode], "seconds": seconds[mode],
                "mean_prompt_tokens": mean_len}
    best = max(v["gemm_gflops"] for v in out["by_dtype"].values())
    for v in out["by_dtype"].values():
        v["fraction_of_best_gemm"] = v["capture_gflops"] / best
    out["best_gemm_gflops"] = best
    for dtype in ("float32", "bfloat16"):
        out[f"shared_prefix_speedup_{dtype}"] = (out["by_dtype"][f"{dtype}, whole prompts"]["seconds"]
                                                 / out["by_dtype"][dtype]["seconds"])
    return out


def bench_shared_prefix(model_name: str, n_prompts: int, batch_size: int, dtype: str = "bfloat16") -> dict:
    """Capture of prompts that share a long prefix (a 3,000-character held-out document read before each row's own
    question, as an agent's tool manual or a RAG context is), prefixes computed once vs every prompt whole."""
    from workbench.capture import tokenize
    from workbench.data.corpus import documents
    from workbench.models import format_chat, load_model

    model = load_model(model_name, device="cpu", dtype=dtype)
    manual = next(d for d in documents("heldout") if len(d) > 3500)[:3000]
    prompts = [{"text": format_chat(model, f"{manual}\n\nQuestion {i}: what does the text above say about "
                                           f"item {i * 37 % 101}? Answer in one line."), "label": i % 2}
               for i in range(n_prompts)]
    lengths = [len(ids) for ids in tokenize(model, [p["text"] for p in prompts], model.cfg.n_ctx)[0]]
    seconds = _capture_seconds(model, prompts, batch_size)
    out = {"dtype": dtype, "n_prompts": n_prompts, "mean_prompt_tokens": sum(lengths) / len(lengths)}
    for mode in ("prefixes", "whole"):
        out[mode] = {"seconds": seconds[mode], "tokens_per_second": sum(lengths) / seconds[mode]}
    out["speedup"] = out["whole"]["seconds"] / out["prefixes"]["seconds"]
    return out


def bench_memory(model_name: str, sizes: list[int]) -> dict:
    out = {}
    for n in sizes:
        proc = subprocess.run(
            [sys.executable, "-c", MEMORY_SCRIPT, model_name, str(n)],
            capture_output=True,
            text=True,
            check=True,
        )
        base_kb, peak_kb = map(int, proc.stdout.split()[-2:])
        out[n] = {
            "rss_after_load_mb": base_kb / 1024,
            "peak_rss_mb": peak_kb / 1024,
            "capture_growth_mb": (peak_kb - base_kb) / 1024,
        }
    small, large = sizes[0], sizes[-1]
    return {
        "model": model_name,
        "by_prompts": out,
        "ratio_peak_large_vs_small": out[large]["peak_rss_mb"] / out[small]["peak_rss_mb"],
    }


def bench_load(model_name: str) -> dict:
    script = (
        "import time, sys; from workbench.models import load_model; t = time.perf_counter(); "
        "m = load_model(sys.argv[1], device='cpu'); print(time.perf_counter() - t, m.workbench['cached'])"
    )
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, WORKBENCH_CACHE=cache)
        runs = []
        for _ in range(2):
            proc = subprocess.run(
                [sys.executable, "-c", script, model_name],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            seconds, cached = proc.stdout.split()[-2:]
            runs.append({"seconds": float(seconds), "cached": cached == "True"})
    return {
        "model": model_name,
        "first": runs[0],
        "cached": runs[1],
        "ratio_first_vs_cached": runs[0]["seconds"] / runs[1]["seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (CI smoke run)")
    parser.add_argument("--only", choices=["roofline"], help="run one section alone (its own results file)")
    args = parser.parse_args()
    # memory is always 1k vs 10k short prompts over three early layers (cheap); --quick shrinks throughput
    n_prompts, sizes = (32 if args.quick else 128), [1000, 10000]
    roofline = bench_roofline(args.model, n_prompts, batch_size=8)
    roofline["long_shared_prefix"] = long = bench_shared_prefix(args.model, n_prompts // 2, batch_size=8)
    for dtype in ("float32", "bfloat16"):
        print(f"chat twins, prefixes where they pay, {dtype}: {roofline[f'shared_prefix_speedup_{dtype}']:.2f}x "
              "the speed of whole prompts")
    print(f"a shared {long['mean_prompt_tokens']:.0f}-token prompt ({long['dtype']}): prefixes computed once "
          f"{long['speedup']:.2f}x the speed of whole prompts")
    for dtype, r in roofline["by_dtype"].items():
        print(f"roofline {dtype}: capture {r['capture_gflops']:.0f} GFLOP/s ({r['tokens_per_second']:.0f} tokens/s) "
              f"= {r['fraction_of_own_gemm']:.0%} of its GEMM rate ({r['gemm_gflops']:.0f} GFLOP/s), "
              f"{r['fraction_of_best_gemm']:.0%} of the best dtype's")
    RESULTS.mkdir(exist_ok=True)
    if args.only == "roofline":
        (RESULTS / f"capture_roofline{'_quick' if args.quick else ''}.json").write_text(json.dumps(roofline, indent=1))
        return
    results = {
        "throughput": bench_throughput(args.model, n_prompts, batch_size=8),
        "memory": bench_memory(args.model, sizes),
        "load": bench_load(args.model),
        "roofline": roofline,
    }
    t, m, ld = results["throughput"], results["memory"], results["load"]
    print(
        f"capture {t['n_prompts']} prompts x {t['sites']} sites: {t['prompts_per_second']:.1f} prompts/s; "
        f"capture / bare full forward = {t['ratio_capture_vs_bare_full']:.2f}x, "
        f"/ bare forward stopped at the same layer = {t['ratio_capture_vs_bare_stopped']:.2f}x"
    )
    for n, row in m["by_prompts"].items():
        print(
            f"memory {n:>6} prompts: peak RSS {row['peak_rss_mb']:.0f} MB (capture adds {row['capture_growth_mb']:.0f} MB)"
        )
    print(f"memory peak ratio {sizes[-1]} vs {sizes[0]} prompts = {m['ratio_peak_large_vs_small']:.2f}x")
    print(
        f"load first {ld['first']['seconds']:.1f} s vs cached {ld['cached']['seconds']:.1f} s "
        f"= {ld['ratio_first_vs_cached']:.1f}x"
    )
    name = "capture_quick.json" if args.quick else "capture.json"
    (RESULTS / name).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
