"""Regenerate the sparse-attention study: ``python studies/sparse_attention/run.py --config studies/sparse_attention/config.yaml [--quick]``.

Writes results.csv, results.json (config, package versions, per-layer metrics) and figure.html
in results/<model>/ beside the config (or in --out).
"""

import argparse
from pathlib import Path

import yaml

from workbench.tools.sparse_attention import run_attention_eval


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
    rows = run_attention_eval(model=config["model"], methods=config["methods"], out=out,
                              context=config["context"], decode_steps=config["decode_steps"], seed=config["seed"],
                              split=config.get("split", "heldout"), config=config)
    print(f"{'method':<16} {'loaded':>7} {'recall':>7} {'out_err':>8} {'KL':>9} {'ppl':>8} {'ppl_full':>8}")
    for r in rows:
        print(f"{r['method']:<16} {r['loaded']:7.3f} {r['recall']:7.3f} {r['out_err']:8.4f} {r['kl']:9.5f} "
              f"{r['ppl']:8.3f} {r['ppl_full']:8.3f}")


if __name__ == "__main__":
    main()
