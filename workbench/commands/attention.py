"""``workbench attention eval``: dense prefill, then teacher-forced decoding under each sparse-attention method."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from workbench.commands.tool_results import write_tool_results
from workbench.errors import WorkbenchError
from workbench.io import check_output_folder
from workbench.tools.drift import check_layers
from workbench.tools.sparse_attention import (
    attention_figure,
    check_positive,
    compare_attention,
    parse_methods,
)


def run_attention_eval(model: str = "smollm2-135m", methods: Sequence[str] | None = None, out: str | None = None,
                       context: int = 4096, decode_steps: int = 64, seed: int = 0, split: str = "heldout",
                       source: str | None = None, progress: bool = True, config: dict | None = None,
                       topology_layers: Sequence[int] | None = None, topology_k: int = 128,
                       sae: str | None = None) -> list[dict]:
    """``workbench attention eval``: prefill ``context`` held-out tokens, decode ``decode_steps`` under each method.

    ``topology_layers`` and ``sae`` (a trained SAE's name or folder) add the topology and SAE drift columns.
    Each finished method is kept in the user cache, so an interrupted run resumes at its first unfinished one.

    Writes results.csv, results.json (config, versions, per-layer metrics) and figure.html to ``out``.
    """

    from workbench.data.corpus import token_blocks
    from workbench.models import load_model
    from workbench.paths import cache_root

    methods = list(methods) if methods else ["full", "topp:0.9", "tactic:0.9", "topk:auto", "quest:auto",
                                             "streaming:auto", "h2o:auto"]

    parse_methods(methods)
    check_positive("context", context)
    check_positive("decode_steps", decode_steps)
    check_output_folder(out)
    torch.manual_seed(seed)
    hooked = load_model(model)
    check_layers(hooked, topology_layers)
    n_ctx = hooked.cfg.n_ctx
    if context + decode_steps + 1 > n_ctx:
        raise WorkbenchError(f"context + decode_steps = {context + decode_steps} exceeds {model}'s context of {n_ctx}.")
    length = context + decode_steps + 1
    tokens = token_blocks(hooked.tokenizer, length, length, split=split, seed=seed, source=source)
    rows = compare_attention(hooked, tokens, context, methods, progress=progress, topology_layers=topology_layers,
                             topology_k=topology_k, sae=sae, seed=seed, cache=cache_root() / "attention-eval")
    if out is not None:
        write_attention_results(rows, out, model, context, decode_steps, source=source, config=config or {
            "model": model, "methods": methods, "context": context, "decode_steps": decode_steps, "seed": seed,
            "split": split, "source": source, "topology_layers": topology_layers, "topology_k": topology_k, "sae": sae})
    return rows


def write_attention_results(rows: list[dict], out, model: str, context: int, decode_steps: int,
                            source: str | None = None, config: dict | None = None) -> None:
    """The tool's results folder (``write_tool_results``)."""
    caption = (f"{model}: dense prefill of {context} held-out tokens, then {decode_steps} teacher-forced decode "
               "steps. loaded: fraction of cached keys read per KV head; recall: attention mass kept; out_err: "
               "relative error of the attention output; kl: KL(full || sparse) of the next-token distribution.")
    write_tool_results(out, rows, config, caption, ("method", "loaded", "recall", "out_err", "kl", "ppl", "ppl_full"),
                       attention_figure(rows, f"Sparse decode attention on {model}, {context}-token context"),
                       drift=("method", f"What sparse decoding does to {model}'s topology and SAE features"),
                       digits=4, source=source)
