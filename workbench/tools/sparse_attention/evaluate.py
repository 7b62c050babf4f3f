"""Evaluation: teacher-forced decoding of a text under each method against full attention.

One dense prefill is shared by every method (its cache is copied per method); decoding runs
through the shared loop (``workbench.tools.decoding``) with the selector's hooks active.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch

from workbench.errors import WorkbenchError
from workbench.models.kv_cache import new_cache
from workbench.tools.decoding import decode_loop
from workbench.tools.sparse_attention.hooks import (
    StepMetrics,
    group_mass,
    layer_types,
    sparse_attention_hooks,
)
from workbench.tools.sparse_attention.selectors import (
    SELECTORS,
    Full,
    Selector,
    check_p,
    check_positive,
    make_selector,
)


def prefill(model, tokens: torch.Tensor, chunk: int = 512):
    """Dense prefill of ``tokens [b, n]`` into a fresh KV cache, in chunks to bound memory.

    Returns ``(cache, patterns)``: ``patterns[L]`` is the prefill attention summed over queries,
    ``[b, heads, n]`` (what H2O accumulates).
    """
    cache = new_cache(model, tokens.shape[0])
    sums: dict[int, torch.Tensor] = {}

    def colsum(pattern, hook):
        L = hook.layer()
        add = pattern.sum(2)
        prev = sums.get(L)
        sums[L] = add if prev is None else torch.nn.functional.pad(prev, (0, add.shape[-1] - prev.shape[-1])) + add

    hooks = [(f"blocks.{L}.attn.hook_pattern", colsum) for L in range(model.cfg.n_layers)]
    decode_loop(model, cache, tokens, lambda step, logits: None, hooks, chunk)  # the prefill alone
    return cache, sums


def decode(model, tokens: torch.Tensor, n_prefill: int, selector: Selector, prefilled=None,
           chunk: int = 512, progress: bool = False, record_sites: Sequence[str] = ()) -> dict:
    """Teacher-forced decoding of ``tokens[:, n_prefill:]`` one token at a time with sparse attention.

    Returns next-token log-probabilities ``[b, steps, vocab]`` for positions
    ``n_prefill .. n-2`` (their targets are the following tokens), the targets, and per-layer
    metrics. ``prefilled`` = ``prefill(model, tokens[:, :n_prefill])`` to reuse one dense prefill.
    ``record_sites``: hook names whose activations at the decoded positions are returned as
    ``streams`` (``{site: (b * steps, d)}``), for the topology and SAE drift.
    """
    from workbench.progress import progress_bar

    if not 1 <= n_prefill < tokens.shape[1] - 1:
        raise WorkbenchError(f"n_prefill={n_prefill} must leave at least 2 tokens to decode in {tokens.shape[1]}.")
    cache, sums = prefilled if prefilled is not None else prefill(model, tokens[:, :n_prefill], chunk)
    cache = copy.deepcopy(cache)
    selector.reset()
    n_kv = model.cfg.n_key_value_heads or model.cfg.n_heads
    for L, s in sums.items():
        selector.observe(L, group_mass(s[:, :, None], n_kv))
    metrics = StepMetrics(model.cfg.n_layers)
    hooks = sparse_attention_hooks(model, selector, cache, n_prefill, metrics)
    recorded: dict[str, list] = {site: [] for site in record_sites}
    hooks += [(site, lambda act, hook: recorded[hook.name].append(act[:, -1].float().clone())) for site in recorded]
    out = []
    last = tokens.shape[1] - 1  # the final token is only a target

    def choose(step, logits):  # teacher forcing: the next token of the text, whatever the model predicted
        out.append(logits.log_softmax(-1))
        bar.update()
        t = n_prefill + step + 1
        return tokens[:, t : t + 1] if t < last else None

    with progress_bar(total=last - n_prefill, desc=type(selector).__name__, disable=not progress, leave=False) as bar:
        decode_loop(model, cache, tokens[:, n_prefill : n_prefill + 1], choose, hooks)
    streams = {site: torch.stack(acts, 1).reshape(-1, acts[0].shape[-1]) for site, acts in recorded.items()}
    return {"logprobs": torch.stack(out, 1), "targets": tokens[:, n_prefill + 1 :], "metrics": metrics.per_layer(),
            "streams": streams}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


MASS_METHODS = ("topp", "tactic")  # their parameter is P, the attention mass kept; the others' a budget in keys


def parse_method(spec: str) -> tuple[str, float | int | str | None]:
    """``"tactic:0.9"`` -> ``("tactic", 0.9)``, ``"topk:64"`` -> ``("topk", 64)``, ``"topk:auto"`` (Tactic's
    measured budget) -> ``("topk", "auto")``, no parameter -> None; a bad one is a one-line error."""
    name, _, param = spec.strip().partition(":")
    if name not in SELECTORS:
        raise WorkbenchError(f"Unknown sparse-attention method {name!r}: choose one of {', '.join(SELECTORS)}.")
    if not param:
        return name, None
    if name == "full":
        raise WorkbenchError(f"{spec!r}: full attention takes no parameter; write 'full'.")
    if param == "auto" and name not in MASS_METHODS:
        return name, "auto"
    try:
        value = float(param) if name in MASS_METHODS else int(param)
    except ValueError:
        what = "P in (0, 1], e.g. 0.9" if name in MASS_METHODS else "a budget in keys (a positive integer) or auto"
        raise WorkbenchError(f"Bad parameter {param!r} for {name}: use {what}.") from None
    if name in MASS_METHODS:
        check_p(value)
    else:
        check_positive(f"{name} budget", value)
    return name, value


def parse_methods(methods: Sequence[str]) -> list[tuple[str, float | int | str | None]]:
    """Every method parsed and checked up front, so a typo fails before the model runs."""
    parsed = [parse_method(m) for m in methods]
    names = [name for name, _ in parsed]
    for i, (name, param) in enumerate(parsed):
        if param == "auto" and "tactic" not in names[:i]:
            raise WorkbenchError(f"Budget 'auto' ({name}:auto) needs a tactic method listed before it.")
    return parsed


def compare_attention(model, tokens: torch.Tensor, n_prefill: int, methods: Sequence[str],
                      chunk: int = 512, progress: bool = True, topology_layers: Sequence[int] | None = None,
                      topology_k: int = 128, sae=None, seed: int = 0, cache=None) -> list[dict]:
    """Teacher-forced decode of ``tokens[:, n_prefill:]`` under each method vs full attention.

    One row per method: mean over layers and steps of the fraction of cached keys loaded
    (per KV head; also per layer type, ``loaded_global`` and, for sliding-window models,
    ``loaded_local``), the attention-mass recall and the relative error of the attention output
    (both against dense attention given the same inputs), the KL(full || sparse) of the
    next-token distribution, and the perplexity of the decoded tokens. Methods are
    ``name[:param]`` with param = P for topp/tactic or a budget in keys for the others;
    ``auto`` uses the mean number of keys Tactic loaded (list a tactic method first).
    ``topology_layers`` / ``sae`` add the drift of the decoded positions' persistent homology and SAE
    reconstruction against full attention (``workbench.tools.drift``). ``cache``: a folder where each finished
    method's row is kept (``workbench.io.ItemCache``, keyed by the model, the tokens, the prefill, the drift meter,
    the code and the package versions), so an interrupted evaluation resumes at its first unfinished method; full
    attention's decode, which every row is measured against, always runs.
    """
    import time

    from workbench.io import ItemCache
    from workbench.models.loading import cache_identity
    from workbench.report import versions
    from workbench.tools.drift import DriftMeter

    parsed = parse_methods(methods)
    meter = DriftMeter(model, topology_layers, topology_k, sae, seed)
    kept = ItemCache.keyed(cache, ["sparse_attention", cache_identity(model), n_prefill, chunk, meter.fingerprint(),
                                   versions()], tokens.cpu().numpy())
    pre = prefill(model, tokens[:, :n_prefill], chunk)
    reference = decode(model, tokens, n_prefill, Full(), prefilled=pre, progress=progress, record_sites=meter.sites)
    if meter.sites:
        meter.set_reference(reference["streams"])
    ref_lp, targets = reference["logprobs"], reference["targets"]
    ppl_full = math.exp(-ref_lp.gather(-1, targets[..., None]).mean().item())
    rows, tactic_budget = [], None
    types = layer_types(model)
    for name, param in parsed:
        if param == "auto":
            value = tactic_budget
        elif param is not None:
            value = param
        else:
            value = 0.9 if name in MASS_METHODS else 256
        held = kept.get(name, [name, value])
        if held is not None:  # finished by an earlier run under the same inputs
            rows.append(held)
            if name == "tactic" and tactic_budget is None:
                tactic_budget = max(1, round(held["loaded_global"] * n_prefill))
            continue
        selector = make_selector(name, p=value) if name in MASS_METHODS else make_selector(name, budget=value)
        t0 = time.perf_counter()
        out = decode(model, tokens, n_prefill, selector, prefilled=pre, progress=progress, record_sites=meter.sites)
        seconds = time.perf_counter() - t0
        lp = out["logprobs"]
        kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1).mean().item()
        met = {k: _mean(v) for k, v in out["metrics"].items()}
        by_type = {f"loaded_{kind}": _mean([x for x, t in zip(out["metrics"]["loaded"], types, strict=True)
                                                     if t == kind])
                   for kind in ("global", "local") if kind in types}
        if name == "tactic" and tactic_budget is None:  # the keys it read where it chose (window layers do not)
            tactic_budget = max(1, round(by_type["loaded_global"] * n_prefill))
        rows.append({
            "method": f"{name}:{value}" if name != "full" else "full",
            "loaded": met["loaded"],
            **by_type,
            "recall": met["recall"],
            "out_err": met["out_err"],
            "kl": kl,
            "ppl": math.exp(-lp.gather(-1, targets[..., None]).mean().item()),
            "ppl_full": ppl_full,
            "context": n_prefill,
            "decode_steps": lp.shape[1],
            "seconds": seconds,
            "per_layer": out["metrics"],
        } | (meter.measure(out["streams"]) if meter.sites else {}))
        kept.put(name, [name, value], rows[-1])
    return rows
