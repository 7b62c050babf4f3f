"""Capture benchmarks on the embedded default model, as ratios against baselines measured in the same run.

1. throughput: ``capture`` (hooks, reduction, shards on disk) vs a bare forward on the same batches,
   both the full ``model(tokens)`` and one stopped at the same deepest layer;
2. memory: peak RSS of a capture of 1k vs 10k prompts (each in a fresh process), which must stay flat;
3. model load: first (GGUF dequantization, in a fresh cache) vs cached.

    python bench/bench_capture.py [--quick] [--model smollm2-135m]
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
    args = parser.parse_args()
    # memory is always 1k vs 10k short prompts over three early layers (cheap); --quick shrinks throughput
    n_prompts, sizes = (32 if args.quick else 128), [1000, 10000]
    results = {
        "throughput": bench_throughput(args.model, n_prompts, batch_size=8),
        "memory": bench_memory(args.model, sizes),
        "load": bench_load(args.model),
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
    RESULTS.mkdir(exist_ok=True)
    name = "capture_quick.json" if args.quick else "capture.json"
    (RESULTS / name).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
