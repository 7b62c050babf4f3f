"""Regenerate the quantization study: ``python studies/quantization/run.py --config studies/quantization/config.yaml [--quick]``.

Writes results.csv, results.json (config, package versions, per-layer drift) and figure.html
in results/<model>/ beside the config (or in --out). Perplexity is full-sequence prefill; the window-end column
is the causal one (see workbench.tools.evaluate).
"""

import argparse
from pathlib import Path

import yaml

from workbench.tools.evaluate import run_quant_eval


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(Path(__file__).with_name("config.yaml")))
    parser.add_argument("--quick", action="store_true", help="use the config's `quick` overrides")
    parser.add_argument("--model", default=None, help="override the config's model")
    parser.add_argument("--out", default=None, help="output folder (default: results/<model> beside the config)")
    args = parser.parse_args()
    config = yaml.safe_load(Path(args.config).read_text())
    quick = config.pop("quick", {})
    if args.quick:
        config.update(quick)
    config["quick"] = args.quick
    if args.model:
        config["model"] = args.model
    out = args.out or str(Path(args.config).parent / "results" / config["model"])
    rows = run_quant_eval(model=config["model"], settings=config["settings"], out=out,
                          n_tokens=config["n_tokens"], block_len=config["block_len"], seed=config["seed"],
                          batch_size=config["batch_size"], drift_blocks=config["drift_blocks"],
                          split=config.get("split", "heldout"), config=config)
    width = max(len(r["setting"]) for r in rows)
    print(f"{'setting':<{width}}  W  A(avg)  mixes    ppl      ppl@win-end  drift(last, all / no BOS)")
    for r in rows:
        print(f"{r['setting']:<{width}} {r['weight_bits']:>2} {r['act_bits']:>6.2f}  {r['mixes']:<7} "
              f"{r['ppl']:8.3f}  {r['ppl_window_end']:10.3f}  {r['drift_last']:.4f} / {r['drift_tokens_last']:.4f}")


if __name__ == "__main__":
    main()
