"""Peak host memory while loading a model, as a multiple of its weights' bytes in the dtype it computes in.

Each load runs in a fresh process: the bare imports first, then the peak resident set is reset
(``/proc/self/clear_refs``), the model loaded, and the new peak read (``VmHWM``). Cases:

- the embedded models from their cached safetensors (float32 and bfloat16);
- a synthetic model with Llama-3-8B's layer shapes (d_model 4096, MLP 14336, 32 heads, 8 KV heads, vocabulary
  128,256, untied) at reduced depth: random bfloat16 weights written to a temporary HF safetensors folder and
  loaded through the same HF path a real ``llama-8b`` takes (``--model-path``), and beside it through
  TransformerLens's own loading steps (those of ``HookedTransformer.from_pretrained``: the HF model, TL's
  converter, a ``HookedTransformer``, ``load_and_process_state_dict``; all in the target dtype, no
  reparametrisation), the named baseline, in the same run; the workbench's loader took those steps before.

The tokenizer's own peak is measured apart (Gemma 3's 262k-entry tokenizer alone takes ~0.5 GB), so the
weights' share is reported beside the total. From the load's structure (the weights once, plus at most one
tensor in transit) the bench extrapolates to Llama-3-8B and -70B in bfloat16. Target: <= 1.5x.

    python bench/bench_load_memory.py [--quick] [--layers 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
LLAMA3 = {"8b": dict(hidden=4096, mlp=14336, heads=32, kv=8, layers=32, vocab=128256),
          "70b": dict(hidden=8192, mlp=28672, heads=64, kv=8, layers=80, vocab=128256)}

PROBE = r'''
import json, sys, time
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
import torch, transformers, transformer_lens  # the bare imports
import workbench.models.loading
how, target, dtype = sys.argv[1:4]
base = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # reset the peak
t = time.perf_counter()
if how == "tokenizer":
    transformers.AutoTokenizer.from_pretrained(target)
    weights = 0
else:
    if how == "workbench":
        from workbench.models import load_model
        name, path = (None, target) if "/" in target else (target, None)
        model = load_model(name, model_path=path, device="cpu", dtype=dtype)
    else:  # TransformerLens's own loading steps (HookedTransformer.from_pretrained's), all in the target dtype
        from transformer_lens import HookedTransformer
        from transformer_lens.loading_from_pretrained import get_pretrained_model_config, get_pretrained_state_dict
        from workbench.models.loading import _neutral_config_folder
        torch_dtype = getattr(torch, dtype)
        hf = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch_dtype)
        cfg = get_pretrained_model_config(str(_neutral_config_folder(hf)), dtype=torch_dtype, fold_ln=False,
                                          device="cpu")
        state = get_pretrained_state_dict(str(_neutral_config_folder(hf)), cfg, hf_model=hf)
        model = HookedTransformer(cfg, tokenizer=transformers.AutoTokenizer.from_pretrained(target),
                                  move_to_device=False)
        model.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                          fold_value_biases=False, refactor_factored_attn_matrices=False)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"seconds": time.perf_counter() - t, "peak_bytes": status("VmHWM") - base, "weights_bytes": weights}))
'''


def measure(how: str, target: str, dtype: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, how, str(target), dtype], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{how} {target} {dtype} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def synthetic_llama(folder: Path, layers: int) -> Path:
    """Llama-3-8B's shapes at ``layers`` layers, random bfloat16 weights, an HF safetensors folder + a tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench.models import load_model

    s = LLAMA3["8b"]
    config = LlamaConfig(hidden_size=s["hidden"], intermediate_size=s["mlp"], num_attention_heads=s["heads"],
                         num_key_value_heads=s["kv"], num_hidden_layers=layers, vocab_size=s["vocab"],
                         max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=generator) if p.ndim > 1 else p.fill_(1.0)
    model.save_pretrained(folder)
    del model
    load_model("smollm2-135m", device="cpu").tokenizer.save_pretrained(folder)  # any tokenizer: not the weights
    return folder


def extrapolate(shape: dict, bytes_per: int = 2) -> dict:
    """Weights and the largest tensor of a Llama-3 model; the load holds the weights plus at most that tensor."""
    d, kv_dim = shape["hidden"], shape["kv"] * shape["hidden"] // shape["heads"]
    layer = 2 * d * d + 2 * d * kv_dim + 3 * d * shape["mlp"] + 2 * d
    weights = (shape["layers"] * layer + 2 * shape["vocab"] * d + d) * bytes_per
    largest = shape["vocab"] * d * bytes_per
    return {"weights_gb": weights / 1e9, "bound_ratio": (weights + largest) / weights}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2, help="depth of the synthetic Llama-3-8B-shaped model")
    p.add_argument("--quick", action="store_true", help="the embedded default only")
    a = p.parse_args()
    from workbench.models.loading import gguf_cache_folder
    from workbench.models.registry import embedded_gguf, resolve

    rows = []

    def row(case: str, how: str, target, dtype: str, tokenizer: Path | None) -> None:
        got = measure(how, str(target), dtype)
        tok = measure("tokenizer", str(tokenizer), dtype)["peak_bytes"] if tokenizer else 0
        rows.append({"case": case, "loader": how, "dtype": dtype, "weights_gb": got["weights_bytes"] / 1e9,
                     "peak_gb": got["peak_bytes"] / 1e9, "ratio": got["peak_bytes"] / got["weights_bytes"],
                     "tokenizer_peak_gb": tok / 1e9,
                     "ratio_without_tokenizer": (got["peak_bytes"] - tok) / got["weights_bytes"],
                     "seconds": got["seconds"]})
        r = rows[-1]
        print(f"{case:<34} {how:<16} {dtype:<9} weights {r['weights_gb']:6.2f} GB  peak {r['peak_gb']:6.2f} GB  "
              f"{r['ratio']:.2f}x ({r['ratio_without_tokenizer']:.2f}x without the tokenizer)  {r['seconds']:.1f} s",
              flush=True)

    for name in ["smollm2-135m"] + ([] if a.quick else ["gemma3-270m"]):
        spec = resolve(name)
        measure("workbench", name, "float32")  # make sure the cache entry exists before measuring
        tokenizer = gguf_cache_folder(spec, embedded_gguf(spec)) / "tokenizer"
        for dtype in ("float32", "bfloat16"):
            row(f"{name} (cached safetensors)", "workbench", name, dtype, tokenizer)
    if not a.quick:
        with tempfile.TemporaryDirectory() as tmp:
            folder = synthetic_llama(Path(tmp) / "llama3-8b-shaped", a.layers)
            case = f"Llama-3-8B shapes, {a.layers} layers (HF)"
            row(case, "workbench", folder, "bfloat16", folder)
            row(case, "transformer-lens", folder, "bfloat16", folder)
    extra = {size: extrapolate(shape) for size, shape in LLAMA3.items()}
    for size, e in extra.items():
        print(f"Llama-3-{size} bfloat16: weights {e['weights_gb']:.1f} GB; the load holds them plus at most one "
              f"tensor: <= {e['bound_ratio']:.3f}x (+ the tokenizer)")
    from workbench.report import versions

    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("load_memory_quick.json" if a.quick else "load_memory.json")
    out.write_text(json.dumps({"versions": versions(), "rows": rows, "extrapolated_bfloat16": extra}, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
