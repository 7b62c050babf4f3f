"""SAE benchmarks: training throughput (SAELens's SAETrainer fed by our store iterator) and all-pairs interference.

python bench/bench_sae.py [--d-in 576] [--d-sae 16384] [--train-steps 20] [--out bench/results/sae.json]

- train: tokens/s of ``workbench.sae.train.train_sae`` on activations already in memory (the store
  iterator's cost is measured separately as read tokens/s), TopK k=32, batch 1024.
- interference: ``interference_scan`` (top-32 partners + all-pairs bins, blocked) on a random decoder
  of ``d_sae`` features: seconds and peak RSS increase (the dense d_sae^2 float32 matrix would be
  d_sae^2 * 4 bytes).
The comparison with SAELens's own LanguageModelSAETrainingRunner (which computes activations itself)
is end to end, in bench_sae_runner.py.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    import torch

    from workbench.io import write_json_atomic
    from workbench.report import versions
    from workbench.sae.interference import interference_scan
    from workbench.sae.train import TrainConfig, train_sae

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-in", type=int, default=576)
    p.add_argument("--d-sae", type=int, default=16384)
    p.add_argument("--train-d-sae", type=int, default=4608)
    p.add_argument("--train-steps", type=int, default=20)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "sae.json"))
    a = p.parse_args()
    torch.manual_seed(0)
    result = {"versions": versions(), "threads": torch.get_num_threads()}

    X = torch.randn(a.train_steps * 1024 + 4096, a.d_in)

    def batches():
        while True:
            for i in range(0, len(X) - 1024, 1024):
                yield X[i : i + 1024]

    cfg = TrainConfig(site="blocks.0.hook_resid_post", d_sae=a.train_d_sae, k=32, n_tokens=a.train_steps * 1024,
                      batch_size=1024, n_checkpoints=0, model_name="bench")
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        train_sae(cfg, batches(), a.d_in, tmp, resume=False, progress=False)
        dt = time.perf_counter() - t
    result["train"] = {"d_in": a.d_in, "d_sae": a.train_d_sae, "tokens": cfg.n_tokens, "seconds": dt,
                       "tokens_per_s": cfg.n_tokens / dt}

    W = torch.randn(a.d_sae, a.d_in)
    before = rss_mb()
    t = time.perf_counter()
    scan = interference_scan(W, k=32, block_size=1024)
    dt = time.perf_counter() - t
    result["interference"] = {"d_sae": a.d_sae, "d_in": a.d_in, "seconds": dt, "peak_rss_increase_mb": rss_mb() - before,
                              "dense_matrix_mb": a.d_sae**2 * 4 / 2**20, "base_rates": scan["base_rates"]}
    write_json_atomic(Path(a.out), result)
    json.dump(result, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
