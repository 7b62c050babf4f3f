"""Why the Gemma 3 SAE has so many dead features: its blocks.9 residual, and an SAE on standardised inputs.

Gemma 3's blocks.9 residual has two channels that hold most of the mean square; the SAE's MSE is then about
those channels. This measures the channels' share, then trains TopK SAEs (k 32, 2,048 features, the same settings and
batches) with each of ``sae train --normalize``'s input normalisations (norm: one scalar, the default;
standardize: each dimension to mean 0, std 1; whiten: SAELens's PCA whitening; center: mean 0 and one scale; each
folded into the saved SAE, so all read raw activations), then whitened ones at higher learning rates and with k 64,
and centred ones, and scores them in raw space on held-out corpus tokens: explained
variance, the median per-dimension explained variance, dead fraction, and the fraction of decoder pairs whose raw
cosine is below 0.1 (how spread the dictionary is in the coordinates interference is read in). Minutes on 2 cores;
not the study's SAE (400k tokens, not 2M). Writes ``gemma_sae_inputs.json`` beside this file (``--tokens`` other
than 400k: beside it, named by the count).

    python studies/polysemantic_interference/experiments/gemma_sae_inputs.py [--tokens 400000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

SITE = "blocks.9.hook_resid_post"


def main() -> None:
    from workbench.models import load_model
    from workbench.paths import cache_dir
    from workbench.report import versions
    from workbench.sae.interference import interference_scan
    from workbench.sae.train import TrainConfig, collect_activations, store_batches, train_sae

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=400_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    work = cache_dir("experiments") / f"gemma-sae-inputs-{args.tokens}"
    model = load_model("gemma3-270m", dtype="auto")
    train = collect_activations(model, [SITE], work / "train", n_tokens=args.tokens, split="train", progress=False)
    test = collect_activations(model, [SITE], work / "test", n_tokens=8192, split="heldout", progress=False)
    x = test.get(SITE).float()
    square = (x**2).mean(0)
    centred = ((x - x.mean(0)) ** 2).mean(0)
    out = {"site": SITE, "train_tokens": args.tokens, "test_tokens": len(x), "seed": args.seed,
           "model_dtype": str(model.cfg.dtype), "versions": versions(),
           "top_channels_share_of_mean_square": {int(i): round(float(v / square.sum()), 4)
                                                 for v, i in zip(*square.topk(3), strict=True)},
           "top5_channels_share_of_variance": round(float(centred.topk(5).values.sum() / centred.sum()), 4),
           "token_norm_percentiles_1_50_99": [round(float(q), 1) for q in x.norm(dim=1).quantile(
               torch.tensor([0.01, 0.5, 0.99]))],
           "saes": {}}
    runs = {"norm": {}, "standardize": {"normalize": "standardize"}, "whiten": {"normalize": "whiten"},
            **{f"whiten lr {lr:g}": {"normalize": "whiten", "lr": lr} for lr in (1e-3, 2e-3, 4e-3)},
            "whiten lr 0.002 k 64": {"normalize": "whiten", "lr": 2e-3, "k": 64},
            **{f"center lr {lr:g}": {"normalize": "center", "lr": lr} for lr in (1e-3, 2e-3)}}
    for name, settings in runs.items():
        cfg = TrainConfig(site=SITE, d_sae=2048, seed=args.seed, n_tokens=args.tokens, n_checkpoints=0,
                          model_name="gemma3-270m", data=str(train.path), **{"k": 32, **settings})
        started = time.perf_counter()
        sae = train_sae(cfg, store_batches(train, SITE, cfg.batch_size, seed=args.seed), x.shape[1],
                        work / f"sae-{name.replace(' ', '-')}", resume=False, progress=False)
        with torch.no_grad():
            f = sae.encode(x)
            xh = sae.decode(f)
        per_dim = 1 - ((x - xh) ** 2).sum(0) / ((x - x.mean(0)) ** 2).sum(0)
        out["saes"][name] = {
            "explained_variance_raw": round(float(1 - ((x - xh) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()), 4),
            "median_per_dimension_explained_variance": round(float(per_dim.median()), 4),
            "dead_fraction": round(float(((f > 0).sum(0) == 0).float().mean()), 4),
            "l0": round(float((f > 0).sum(1).float().mean()), 1),
            "decoder_pairs_below_0.1": round(interference_scan(sae.W_dec.detach(), k=1)["base_rates"][0], 4),
            "train_seconds": round(time.perf_counter() - started, 1)}
        print(name, out["saes"][name], flush=True)
    suffix = "" if args.tokens == 400_000 else f"_{args.tokens}"
    Path(__file__).with_name(f"gemma_sae_inputs{suffix}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
