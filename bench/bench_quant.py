"""Quantized-hooked forward time vs float forward time, as ratios measured in the same run.

Float and quantized passes alternate on the same batch, so a busy machine slows both alike.

    python bench/bench_quant.py [--model tiny|smollm2-135m] [--batch 2] [--seq 512] [--repeats 3]

Fake quantization adds work (it simulates low precision in float32), so the ratio is the
overhead of the simulation, not a speed-up a real low-precision kernel would give.
Writes bench/results/quant.json.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from workbench.report import versions
from workbench.tools.quant_eval import PRESETS, apply_setting

SETTINGS = [
    "A8",
    "A4+STaMP",
    "A4+STaMP-dct+sink",
    "A4+STaMP-wht",
    "A4+rot+STaMP+sink",
    "W4A8",
    "FP8-e4m3-tensor",
    "FP8-e4m3-mx",
]


def paired_times(model, tokens, setting, repeats):
    """Float and quantized forward times, interleaved so machine noise hits both alike."""
    float_t, quant_t = [], []
    with torch.inference_mode():
        model(tokens)
        with apply_setting(model, setting):
            model(tokens)
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(tokens)
            float_t.append(time.perf_counter() - t0)
            with apply_setting(model, setting):
                t0 = time.perf_counter()
                model(tokens)
                quant_t.append(time.perf_counter() - t0)
    return statistics.median(float_t), statistics.median(quant_t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).with_name("results") / "quant.json"))
    args = parser.parse_args()

    from workbench.models import load_model

    model = load_model(args.model)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, min(model.cfg.d_vocab, 30000), (args.batch, args.seq), generator=gen)
    rows = []
    for name in SETTINGS:
        float_s, quant_s = paired_times(model, tokens, PRESETS[name], args.repeats)
        rows.append(
            {"setting": name, "float_seconds": float_s, "seconds": quant_s, "ratio": quant_s / float_s}
        )

    print(
        f"{args.model}, batch {args.batch} x {args.seq} tokens, median of {args.repeats}, "
        f"{torch.get_num_threads()} thread(s)"
    )
    print(f"{'setting':<16} {'float s':>9} {'quant s':>9} {'ratio':>7}")
    for r in rows:
        print(f"{r['setting']:<16} {r['float_seconds']:9.4f} {r['seconds']:9.4f} {r['ratio']:7.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "model": args.model,
                "batch": args.batch,
                "seq": args.seq,
                "repeats": args.repeats,
                "versions": versions(),
                "rows": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
