"""How long the injection detector takes to train and how fast it scores, as a user runs it.

Training: `workbench detect --train` in a fresh process with an empty detector cache (model load, the training
prompts of every source, their features at the candidate layers, the inner leave-one-source-out choice, the
saved JSON), against the issue's budget of 180 s on the embedded default (ratio = measured / budget, <= 1
passes). What every command builds once on first use (dequantized weights, the generator's text corpus) is
built before the clock starts and reported on its own row.

Scoring: the trained detector's prompts per second on ~200-token prompts (generator documents, the user
message only, as `workbench detect --prompts` reads them), in the dtype `workbench detect` picks here (``auto``:
bfloat16 on a CPU with AVX512-BF16/AMX) and in float32, against the issue's floor of 10 prompts/s, and
against a named baseline measured in the same run: the features of the first detector layout (three mid
layers 6, 12, 18 of SmolLM2 and the TaskTracker delta pass, float32, TransformerLens's attention and MLP; ratio = ours /
baseline, > 1 is faster).

The GEMM-only ceiling says how far the floor is from this CPU: the prompts per second scoring would reach if it
did nothing but its linear layers (q, k, v, o and the MLP's, to the detector's layer, at the scored prompts' mean
chat-wrapped length), each GEMM timed here on a batch's rows in the scoring dtype. Attention, norms and the rest
come on top, so scoring stays below it; where the ceiling is below the floor, no exact forward meets the floor.

    python bench/bench_detect.py [--quick] [--model smollm2-135m]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import print_table, write_results  # noqa: E402

TRAIN_BUDGET_S = 180.0
SCORE_FLOOR = 10.0  # prompts per second


def warm_shared_caches(model: str, cache: Path) -> float:
    """Build what every command shares on first use (the dequantized weights, the generator's text corpus) in
    ``cache``, so the timed training pays for the detector alone, as every run after a user's first does."""
    code = ("import sys; from workbench.models import load_model; load_model(sys.argv[1]); "
            "from workbench.detect.trained import source_records; source_records()")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, model], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env={**os.environ, "WORKBENCH_CACHE": str(cache)})
    return time.perf_counter() - started


def train_by_cli(model: str, pairs: int | None, folder: Path, cache: Path) -> float:
    command = [str(Path(sys.executable).with_name("workbench")), "detect", "--train", "--model", model,
               "--detector-dir", str(folder)]
    if pairs is not None:
        command += ["--pairs", str(pairs)]
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "TQDM_DISABLE": "1", "WORKBENCH_CACHE": str(cache)})
    return time.perf_counter() - started


def scoring_prompts(model, n: int) -> list[dict]:
    """The ``n`` generator user messages (clean and injected alike) whose length is nearest 200 tokens."""
    from workbench.conditions import get_condition

    records = get_condition("injection").prompts(None, 4 * n, seed=123)
    records.sort(key=lambda r: abs(len(model.to_tokens(r["text"])[0]) - 200))
    return [{"text": r["text"]} for r in records[:n]]


def linear_shapes(model) -> list[tuple[int, int]]:
    """(in, out) of one block's GEMMs as the fused scoring path runs them: q, k, v, o, the MLP's gate and input as
    one GEMM (one alone where there is no gate), and its output."""
    block = model.blocks[0]
    attn, mlp, d = block.attn, block.mlp, model.cfg.d_model
    kv = getattr(attn, "_W_K", attn.W_K)  # grouped-query keys and values are held per KV head
    heads = attn.W_Q.shape[0] * attn.W_Q.shape[2]
    d_mlp = mlp.W_in.shape[1]
    gate_in = 2 * d_mlp if hasattr(mlp, "W_gate") else d_mlp
    return [(d, heads), (d, kv.shape[0] * kv.shape[2]), (d, kv.shape[0] * kv.shape[2]), (heads, d),
            (d, gate_in), (d_mlp, d)]


def gemm_ceiling(model, layer: int, tokens: float, batch: int = 8, repeats: int = 5) -> dict:
    """Prompts per second of the linear layers alone to ``layer`` for prompts of ``tokens`` tokens, each GEMM timed
    on ``batch`` prompts' rows in the model's dtype; with the GFLOP per prompt and the GEMM rate reached."""
    import torch
    import torch.nn.functional as F

    rows, dtype, seconds = int(round(batch * tokens)), model.cfg.dtype, 0.0
    shapes = linear_shapes(model)
    with torch.inference_mode():
        for n_in, n_out in shapes:
            x, w = torch.randn(rows, n_in, dtype=dtype), torch.randn(n_out, n_in, dtype=dtype)
            F.linear(x, w)  # warm-up
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                F.linear(x, w)
                best = min(best, time.perf_counter() - start)
            seconds += best
    per_prompt = seconds * (layer + 1) / batch
    gflop = 2 * tokens * sum(a * b for a, b in shapes) * (layer + 1) / 1e9
    return {"prompts_per_s": 1 / per_prompt, "gflop_per_prompt": gflop, "gflop_per_s": gflop / per_prompt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--quick", action="store_true", help="fewer training pairs (20) and 48 scored prompts")
    args = parser.parse_args()

    from workbench.capture import normalize_prompts
    from workbench.commands.detect import load_detector
    from workbench.detect.features import activation_features, shown_tokens
    from workbench.detect.trained import as_user_file, score_prompts
    from workbench.models import has_chat_template, load_model

    pairs, n_score = (20, 48) if args.quick else (None, 160)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "detector"
        first_use_s = warm_shared_caches(args.model, Path(tmp) / "cache")
        train_s = train_by_cli(args.model, pairs, folder, Path(tmp) / "cache")
        detector = load_detector(folder / "detector.json")
        rows.append({"what": f"detect --train ({detector['n_train']} prompts)", "seconds": train_s,
                     "target": f"<= {TRAIN_BUDGET_S:.0f} s", "ratio": train_s / TRAIN_BUDGET_S})

        hooked = load_model(args.model, dtype="auto")  # as `workbench detect` loads it
        float32 = load_model(args.model)
        prompts = scoring_prompts(hooked, n_score)
        tokens = sum(len(hooked.to_tokens(p["text"])[0]) for p in prompts) / len(prompts)
        _, ids, _, _ = shown_tokens(hooked, as_user_file(normalize_prompts(prompts), detector["reads"]),
                                    detector["config"]["max_tokens"], detector.get("chat", True))
        shown = sum(map(len, ids)) / len(ids)  # as the model reads them: in the chat template
        ceiling = gemm_ceiling(hooked, detector["layer"], shown)

        def rate(model) -> float:
            score_prompts(model, detector, prompts[:8], progress=False)  # warm-up
            start = time.perf_counter()
            score_prompts(model, detector, prompts, progress=False)
            return len(prompts) / (time.perf_counter() - start)

        ours = rate(hooked)
        ours_float32 = rate(float32) if hooked.workbench["dtype"] != "float32" else ours
        os.environ["WORKBENCH_FUSED_ATTENTION"] = "0"  # the baselines as they ran: TransformerLens's attention
        unfused = rate(hooked)
        start = time.perf_counter()
        activation_features(float32, prompts, [6, 12, 18], delta=True, chat=has_chat_template(float32),
                            progress=False)
        baseline = len(prompts) / (time.perf_counter() - start)
        del os.environ["WORKBENCH_FUSED_ATTENTION"]
    rows.append({"what": "first use only: weights + text corpus built", "seconds": first_use_s, "target": "once",
                 "ratio": None})
    what = f"score ({detector['pipeline']['name']}, layer {detector['layer']}"
    rows.append({"what": f"{what}, {hooked.workbench['dtype']}: the default here)", "prompts_per_s": ours,
                 "target": f">= {SCORE_FLOOR:.0f}/s", "ratio": ours / SCORE_FLOOR})
    rows.append({"what": f"GEMM-only ceiling: the linear layers to layer {detector['layer']} alone "
                         f"({ceiling['gflop_per_prompt']:.1f} GFLOP per prompt at {ceiling['gflop_per_s']:.0f} "
                         f"GFLOP/s, {hooked.workbench['dtype']})", "prompts_per_s": ceiling["prompts_per_s"],
                 "target": f">= {SCORE_FLOOR:.0f}/s", "ratio": ceiling["prompts_per_s"] / SCORE_FLOOR})
    if hooked.workbench["dtype"] != "float32":
        rows.append({"what": f"{what}, float32: a CPU without bfloat16)", "prompts_per_s": ours_float32,
                     "target": f">= {SCORE_FLOOR:.0f}/s", "ratio": ours_float32 / SCORE_FLOOR})
    rows.append({"what": f"{what}, {hooked.workbench['dtype']}, TransformerLens attention and MLP)",
                 "prompts_per_s": unfused, "target": "same run", "ratio": ours / unfused})
    rows.append({"what": "baseline: layers 6,12,18 + delta features, float32, TransformerLens attention and MLP",
                 "prompts_per_s": baseline, "target": "same run", "ratio": ours / baseline})
    print(f"{len(prompts)} prompts of {tokens:.0f} tokens on average ({shown:.0f} in the chat template); scoring "
          f"ran at {ours / ceiling['prompts_per_s']:.0%} of the GEMM-only ceiling")
    print_table(rows, ["what", "seconds", "prompts_per_s", "target", "ratio"])
    write_results("detect_quick" if args.quick else "detect", args, rows, mean_tokens=tokens, mean_shown_tokens=shown,
                  share_of_gemm_ceiling=ours / ceiling["prompts_per_s"],
                  detector={k: detector[k] for k in ("layer", "inner_auc", "n_train", "sources", "choice")},
                  load_average=os.getloadavg())
    print(json.dumps({r["what"]: round(r["ratio"], 2) for r in rows if r["ratio"] is not None}))


if __name__ == "__main__":
    main()
