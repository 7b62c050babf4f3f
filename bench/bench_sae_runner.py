"""SAE training end to end: our pipeline vs SAELens's own LanguageModelSAETrainingRunner, same tokens and settings.

Both start from the same corpus token blocks (context 128) and the loaded embedded model, and train the
same SAE (TopK, d_sae, k, batch, lr, 20 batches for the norm estimate) on one site:

- SAELens: ``LanguageModelSAETrainingRunner(cfg, override_dataset=<the blocks as a tokenized HF Dataset>,
  override_model=<our HookedTransformer>)``: it generates activations into its mixing buffer while it trains;
- ours: ``collect_activations`` (forward stopped after the site's layer, float16 shards on disk) then
  ``train_sae`` on the stored activations (SAELens's SAETrainer underneath, so the optimisation is the same).

Ours runs twice: collecting with the model in float32 (as the runner computes), and with a copy of it in
``--collect-dtype`` (bfloat16: ``sae train --collect-dtype``), the SAE trained in float32 either way.

Reported: end-to-end tokens/s of each for one SAE, and for ``--n-saes`` SAEs on the same site (sweeps
are the common case: ours collects once, the runner regenerates activations for every SAE); and the quality
of every SAE trained (``evaluate_sae`` with the float32 model on 4,096 held-out corpus tokens: L0, explained
variance, dead fraction, CE loss recovered), so a speed-up is never bought with a worse SAE unseen.

    python bench/bench_sae_runner.py [--quick] [--tokens 131072] [--n-saes 3] [--collect-dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    import torch

    from workbench.data.corpus import token_blocks
    from workbench.models import load_model
    from workbench.report import versions
    from workbench.sae.train import TrainConfig, collect_activations, evaluate_sae, store_batches, train_sae

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--site", default="blocks.6.hook_resid_post")
    p.add_argument("--tokens", type=int, default=131072)
    p.add_argument("--d-sae", type=int, default=2048)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--n-saes", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="32k tokens")
    p.add_argument("--collect-dtype", default="bfloat16", help="our fast collection's model dtype")
    a = p.parse_args()
    if a.quick:
        a.tokens = 32768
    torch.manual_seed(0)
    model = load_model(a.model, device="cpu")
    d_in, context = model.cfg.d_model, 128
    blocks = token_blocks(model.tokenizer, a.tokens + a.tokens // context, context, split="train", seed=0)
    eval_blocks = token_blocks(model.tokenizer, 4096, context, split="heldout", seed=0)
    result = {"versions": versions(), "threads": torch.get_num_threads(), "model": a.model, "site": a.site,
              "tokens": a.tokens, "d_sae": a.d_sae, "k": a.k, "batch": a.batch, "collect_dtype": a.collect_dtype}
    quality = {}
    n = a.n_saes
    runs = {"float32": model, a.collect_dtype: load_model(a.model, device="cpu", dtype=a.collect_dtype)}
    for dtype, collector in runs.items():
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            store = collect_activations(collector, [a.site], Path(tmp) / "store", n_tokens=len(blocks) * context,
                                        block_len=context, progress=False)
            collect_s = time.perf_counter() - t
            cfg = TrainConfig(site=a.site, d_sae=a.d_sae, k=a.k, batch_size=a.batch, n_tokens=a.tokens,
                              n_checkpoints=0, model_name=a.model)
            t = time.perf_counter()
            sae = train_sae(cfg, store_batches(store, a.site, a.batch), d_in, Path(tmp) / "sae", resume=False,
                            progress=False)
            train_s = time.perf_counter() - t
            quality[f"ours, collected in {dtype}"] = evaluate_sae(model, sae, eval_blocks)
        result[f"ours_{dtype}"] = {"collect_seconds": collect_s, "train_seconds": train_s,
                                   "blocks_collected": store.n_rows, "store_dtype": store.manifest["dtype"]}
        print(f"ours ({dtype} collection): collect {collect_s:.1f} s + train {train_s:.1f} s", flush=True)

    runner_s, runner_sae = runner_run(model, blocks, a, d_in, context)
    quality["SAELens runner"] = evaluate_sae(model, runner_sae, eval_blocks)
    result["saelens_runner"] = {"seconds": runner_s}
    result["quality"] = quality
    for dtype in runs:
        ours = result[f"ours_{dtype}"]
        one = ours["collect_seconds"] + ours["train_seconds"]
        several = ours["collect_seconds"] + n * ours["train_seconds"]
        result[f"ratio_ours_{dtype}_vs_runner_one_sae"] = runner_s / one
        result[f"ratio_ours_{dtype}_vs_runner_{n}_saes"] = n * runner_s / several
        print(f"one SAE, {a.tokens} tokens: ours ({dtype} collection) {one:.1f} s vs SAELens runner {runner_s:.1f} s "
              f"= {runner_s / one:.2f}x; {n} SAEs: {n * runner_s / several:.2f}x")
    for name, q in quality.items():
        print(f"  {name:<32} L0 {q['l0']:5.1f}  EV {q['explained_variance']:.3f}  dead {q['dead_fraction']:.3f}  "
              f"CE recovered {q['ce_recovered']:.3f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / ("sae_runner_quick.json" if a.quick else "sae_runner.json")).write_text(json.dumps(result, indent=1))


def runner_run(model, blocks, a, d_in: int, context: int):
    """(wall time, SAE) of SAELens's runner training the same SAE on the same blocks (no wandb, no checkpoints)."""
    import datasets
    from sae_lens.config import LanguageModelSAERunnerConfig, LoggingConfig
    from sae_lens.llm_sae_training_runner import LanguageModelSAETrainingRunner
    from sae_lens.saes.topk_sae import TopKTrainingSAEConfig

    dataset = datasets.Dataset.from_dict({"input_ids": blocks.tolist()})
    with tempfile.TemporaryDirectory() as tmp:
        cfg = LanguageModelSAERunnerConfig(
            sae=TopKTrainingSAEConfig(d_in=d_in, d_sae=a.d_sae, k=a.k, normalize_activations="expected_average_only_in"),
            model_name=a.model, hook_name=a.site, dataset_path="workbench-corpus", is_dataset_tokenized=True,
            streaming=False, context_size=context, training_tokens=a.tokens, train_batch_size_tokens=a.batch,
            store_batch_size_prompts=8, n_batches_in_buffer=8, n_batches_for_norm_estimate=20, lr=4e-4,
            device="cpu", logger=LoggingConfig(log_to_wandb=False), n_checkpoints=0, checkpoint_path=f"{tmp}/ckpt",
            output_path=f"{tmp}/out", verbose=False, prepend_bos=False)
        t = time.perf_counter()
        sae = LanguageModelSAETrainingRunner(cfg, override_dataset=dataset, override_model=model).run()
        return time.perf_counter() - t, sae


if __name__ == "__main__":
    sys.exit(main())
