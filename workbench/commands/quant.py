"""``workbench quant eval``: score quantization settings on held-out corpus text and write a results folder."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from workbench.commands.tool_results import write_tool_results
from workbench.errors import WorkbenchError
from workbench.io import check_output_folder
from workbench.tools.drift import check_layers
from workbench.tools.quant_eval import PRESETS, QUANT_COLUMNS, compare_settings, quant_figure, resolve_setting


def run_quant_eval(model: str = "smollm2-135m", settings: Sequence[str | dict] | None = None,
                   out: str | None = None, n_tokens: int = 16384, block_len: int = 512, seed: int = 0,
                   batch_size: int = 2, drift_blocks: int = 2, split: str = "heldout",
                   source: str | None = None, progress: bool = True, config: dict | None = None,
                   topology_layers: Sequence[int] | None = None, topology_k: int = 128,
                   sae: str | None = None) -> list[dict]:
    """Load ``model``, score ``settings`` on held-out corpus text, write results.{csv,json} and figure.html to ``out``.

    This is ``workbench quant eval``. ``settings`` defaults to every preset; ``source`` is a
    local .txt/.md/.jsonl file or folder instead of the package-docs corpus; ``topology_layers``
    and ``sae`` (a trained SAE's name or folder) add the topology and SAE drift columns. Each finished setting
    is kept in the user cache, so an interrupted run resumes at its first unfinished one.
    """
    from workbench.data.corpus import token_blocks
    from workbench.models import load_model
    from workbench.paths import cache_root

    chosen = list(settings) if settings else list(PRESETS)
    resolved = [resolve_setting(s) for s in chosen]  # fail on a typo before loading anything
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < block_len:
        raise WorkbenchError(f"n_tokens={n_tokens!r}: evaluate at least one block of {block_len} tokens")
    check_output_folder(out)
    torch.manual_seed(seed)
    hooked = load_model(model)
    check_layers(hooked, topology_layers)
    blocks = token_blocks(hooked.tokenizer, n_tokens, block_len, split=split, seed=seed, source=source)
    rows = compare_settings(hooked, blocks, resolved, batch_size=batch_size, drift_blocks=drift_blocks,
                            progress=progress, topology_layers=topology_layers, topology_k=topology_k,
                            sae=sae, seed=seed, cache=cache_root() / "quant-eval")
    if out is not None:
        write_quant_results(rows, out, model, block_len, resolved, source=source, config=config or {
            "model": model, "n_tokens": n_tokens, "block_len": block_len, "seed": seed, "batch_size": batch_size,
            "drift_blocks": drift_blocks, "split": split, "source": source, "topology_layers": topology_layers,
            "topology_k": topology_k, "sae": sae})
    return rows


def write_quant_results(rows: list[dict], out, model: str, block_len: int, settings: Sequence,
                        source: str | None = None, config: dict | None = None) -> None:
    """The tool's results folder (``write_tool_results``) with the settings and how perplexity is counted."""
    n_tokens = rows[0]["n_tokens"]
    caption = (f"{model}, {n_tokens} held-out tokens in blocks of {block_len}. ppl: full-sequence prefill; "
               "ppl_window_end: causal positions only (see workbench.tools.quant_eval); drift: relative L2 error "
               "of resid_post vs float (tokens = without BOS).")
    extra = {
        "settings": [dataclasses.asdict(resolve_setting(s)) for s in settings],
        "causality": "ppl: full-sequence prefill (non-causal under sequence transforms); "
                     "ppl_window_end: predictions at the last position of each 2**levels window only "
                     "(causal under Haar, NaN when the transform spans the whole sequence).",
    }
    write_tool_results(out, rows, config, caption, QUANT_COLUMNS,
                       quant_figure(rows, f"Quantization of {model} ({n_tokens} held-out tokens)"),
                       drift=("setting", f"What quantization does to {model}'s topology and SAE features"),
                       source=source, extra=extra)
