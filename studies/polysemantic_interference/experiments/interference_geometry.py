"""Decoder-cosine interference in raw coordinates vs the activations' own (whitened) coordinates.

The study measures interference as |cos| of two SAE decoder rows in raw residual coordinates. A whitened SAE
(``sae train --normalize whiten``) is trained in PCA-whitened coordinates and folded back for saving: each raw
decoder row is its whitened row stretched by sqrt(eigenvalue) along each principal direction, so when one
direction holds most of the variance (Gemma 3's blocks.9: about half), every folded row leans toward it and raw
cosines are large for almost every pair. Cosines in whitened coordinates (the Mahalanobis cosine under the
activations' covariance) do not depend on how the SAE was trained. This scores both geometries for the study's
analysis SAE of each model, from the study's own cached SAEs and activation stores (run the study first): the
base rates in the study's bins, pairs at |cos| >= 0.3, the variance share of the top principal directions and
how much of an average unit decoder row lies along the first. The mirror case holds as well: an SAE trained on
raw or centred inputs is spread in raw coordinates and crowded in whitened ones, so a map is read in the
coordinates its SAE was trained in. Seconds on 2 cores. Writes ``interference_geometry.json`` beside this file
(the committed one scores the study's current analysis SAEs; the whitened Gemma SAE's is in the history, commit
bdd98a6).

    python studies/polysemantic_interference/experiments/interference_geometry.py [--every 16]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import yaml

HERE = Path(__file__).resolve().parent
BINS = [0.0, 0.1, 0.2, 0.3, 0.4, 1.0 + 1e-9]


def rates(W: torch.Tensor) -> dict:
    """Base rates of |cos| between distinct rows in the study's bins, and the count at >= 0.3."""
    U = W / W.norm(dim=1, keepdim=True)
    c = (U @ U.T).abs()
    iu = torch.triu_indices(len(U), len(U), 1)
    v = c[iu[0], iu[1]].numpy()
    return {"base_rates": (np.histogram(v, BINS)[0] / len(v)).round(5).tolist(), "n_pairs": int(len(v)),
            "pairs_at_0.3": int((v >= 0.3).sum()), "median": round(float(np.median(v)), 4)}


def main() -> None:
    from safetensors.torch import load_file

    from workbench.commands.polysemantic import model_config, sae_name
    from workbench.commands.sae import default_store_path
    from workbench.models import load_model
    from workbench.paths import cache_dir
    from workbench.report import versions
    from workbench.sae.interference import store_sample, whitened_rows
    from workbench.store import ActivationStore

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=int, default=16, help="use every n-th shard of the store for the covariance")
    args = parser.parse_args()
    study = yaml.safe_load((HERE.parent / "config.yaml").read_text())
    out = {"every_nth_shard": args.every, "versions": versions(), "models": {}}
    for name in study["grid"]["model"]:
        cfg = model_config({**study["fixed"], "seed": study["seed"], "model": name}, name)
        spec = cfg["saes"][cfg["analysis_sae"]]
        folder = cache_dir("saes") / "trained" / sae_name(cfg, cfg["analysis_sae"])
        if not (folder / "sae_weights.safetensors").exists():
            raise SystemExit(f"{folder} does not exist: run the study first")
        c = cfg["collect"]
        model = load_model(name, device="cpu")
        store = ActivationStore(default_store_path(model, c["sites"], c["n_tokens"], c["block_len"], cfg["seed"],
                                                   cfg.get("source")))
        del model
        site = spec["site"]
        x = store_sample(store, site, args.every)
        lam, V = torch.linalg.eigh(torch.cov((x - x.mean(0)).T))  # for the variance shares reported below
        W = load_file(str(folder / "sae_weights.safetensors"))["W_dec"].double()
        whitened = whitened_rows(W, x).double()  # the study's own `--geometry whitened`
        along_top = ((W / W.norm(dim=1, keepdim=True)) @ V[:, -1]) ** 2
        out["models"][name] = {
            "sae": folder.name, "site": site, "normalize": spec.get("normalize", "norm"), "tokens": int(len(x)),
            "top5_variance_share": [round(float(v), 4) for v in lam.flip(0)[:5] / lam.sum()],
            "decoder_row_share_on_top_direction_mean": round(float(along_top.mean()), 4),
            "raw": rates(W), "whitened": rates(whitened)}
        print(name, json.dumps(out["models"][name]))
    (HERE / "interference_geometry.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
