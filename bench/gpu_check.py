"""The GPU check of the big-model path, as one short script for a lent GPU machine (never run by CI).

1. A synthetic model with Llama-3-8B's layer shapes (``--layers`` deep; 32 is the real depth, 16 GB in
   bfloat16) is written as an HF safetensors checkpoint and loaded the way ``--model llama-8b --device cuda``
   loads it (``load_model(model_path=..., device="cuda", dtype="bfloat16")``); load seconds, peak host and GPU
   memory, and the GPUs it was split over are recorded.
2. ``capture`` at four layers (last token) and the probe's topology on the captured clouds run there unchanged;
   capture throughput in real (unpadded) tokens per second is recorded.
3. The Triton distance kernel against ``torch.cdist`` on the GPU, n = 4096 and 16384, d = 4096: time ratio and
   largest error against a float64 reference.

Everything goes to ``--out`` (default ``$OUT`` when set, else bench/results) as ``gpu_check.json``.

    python bench/gpu_check.py [--layers 8] [--prompts 256]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_load_memory import synthetic_llama  # noqa: E402


def timed(fn):
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    value = fn()
    sync()
    return time.perf_counter() - start, value


def check_model(layers: int, n_prompts: int, tmp: Path, device: str = "cuda") -> dict:
    import numpy as np
    import torch

    from workbench.capture import capture, resid_sites
    from workbench.models import load_model
    from workbench.probe import ProbeConfig, analyze_condition

    folder = synthetic_llama(tmp / "llama3-8b-shaped", layers)
    gpu = device.startswith("cuda")
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    load_s, model = timed(lambda: load_model(model_path=folder, device=device, dtype="bfloat16"))
    devices = sorted({str(p.device) for p in model.parameters()})
    rng = np.random.default_rng(0)
    words = ["report", "meeting", "invoice", "ignore", "previous", "send", "the", "file", "to", "data", "please"]
    prompts = [{"text": " ".join(rng.choice(words, 40 + i % 80)), "label": ["clean", "injected"][i % 2]}
               for i in range(n_prompts)]
    sites = resid_sites(model, sorted({0, layers // 3, 2 * layers // 3, layers - 1}))
    capture_s, store = timed(lambda: capture(model, prompts, sites, tmp / "store", batch_size=32, progress=False))
    config = ProbeConfig.quick(k=min(32, n_prompts // 8), K=8, layers=[int(s.split(".")[1]) for s in sites])
    topo_s, result = timed(lambda: analyze_condition(store, "injection", config, tmp / "layers", False))
    tokens = sum(len(model.tokenizer(p["text"])["input_ids"]) for p in prompts)
    return {"layers": layers, "load_s": load_s, "devices": devices, "n_devices": model.cfg.n_devices,
            "gpu_peak_gb": torch.cuda.max_memory_allocated() / 1e9 if gpu else None,
            "host_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
            "capture_s": capture_s, "capture_tokens_per_s": tokens / capture_s, "topology_s": topo_s,
            "probe_layers": sorted(result.layers)}


def check_distances() -> list[dict]:
    import torch
    from workbench.kernels import pairwise_distances

    rows = []
    for n in (4096, 16384):
        X = torch.randn(n, 4096, device="cuda") + 10.0
        ours, D = timed(lambda X=X: pairwise_distances(X, backend="triton"))  # the first call compiles
        ours = min(timed(lambda X=X: pairwise_distances(X, backend="triton"))[0] for _ in range(2))
        base = min(timed(lambda X=X: torch.cdist(X, X))[0] for _ in range(2))
        pick = torch.arange(0, n, n // 64, device="cuda")
        ref = torch.cdist(X[pick].double(), X.double(), compute_mode="donot_use_mm_for_euclid_dist")
        rows.append({"n": n, "d": 4096, "triton_s": ours, "cdist_s": base, "ratio_cdist_over_triton": base / ours,
                     "max_abs_error": float((D[pick].double() - ref).abs().max())})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--device", default="cuda", help="cpu: a smoke test of the model part only (no distances)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or Path(__file__).parent / "results"))
    a = p.parse_args()
    import torch

    gpu = a.device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: this check runs on a GPU machine (--device cpu: a smoke test)")
    from workbench.report import versions

    result = {"versions": versions(), "device": torch.cuda.get_device_name(0) if gpu else "cpu",
              "count": torch.cuda.device_count()}
    if gpu:
        result["distances"] = check_distances()
        print(json.dumps(result["distances"], indent=1), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        result["model"] = check_model(a.layers, a.prompts, Path(tmp), a.device)
    print(json.dumps(result["model"], indent=1), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
