"""KV caches: the empty cache decoding starts from, and prompt prefixes computed once for the rows that share them.

Prompts read through a chat template begin with the same tokens (the template's system turn, often a task
instruction, sometimes a long system prompt or document), and a clean/injected pair shares everything before the
insertion. ``forward_on_prefixes`` runs a batch in two passes: one row per group of rows sharing a prefix
(``prefix_groups``) fills a TransformerLens key/value cache, and then only each row's own tokens run on top of its
group's cached keys (masked to its own prefix, rotated at its own positions). Every hook still sees the whole
``[batch, pos, ...]`` activation, the prefix's positions gathered from the first pass. Attention over cached keys
is the same math as over recomputed ones, so results equal a full pass up to floating-point rounding (tested).
A batch runs this way only where it pays: both passes together must hold at most ``PAYS`` of the whole batch's
padded tokens (a long prompt prefix shared by every row does; the 24-token chat turn of ~230-token prompts, or
twins whose insertion points vary, do not). Only read-only hooks at per-position sites (the residual stream,
attention and MLP outputs, embeddings) can run this way; anything else runs the full pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Sequence

import torch

from workbench.errors import WorkbenchError

# Sites whose activation is [batch, pos, ...] and depends on earlier positions only through attention: what cached
# keys and values reproduce. Hooks reading scores, patterns or q/k/v, or editing activations, do not qualify.
POSITION_SITES = re.compile(r"^(hook_embed|hook_pos_embed|ln_final\.hook_normalized|"
                            r"blocks\.\d+\.hook_(resid_pre|resid_mid|resid_post|attn_out|mlp_out))$")
SWITCH = "WORKBENCH_SHARED_PREFIX"  # "0": every row computes its whole prompt (for parity checks)
MIN_PREFIX = 4  # a group shares at least this many tokens beyond what the whole batch shares
# Two passes cost more per token than one (smaller GEMMs, masks, the gathers): on 2 CPU cores, 64 SmolLM2 chat
# twins in bfloat16 run on prefixes took 1.28x the time of whole batches (one hand-timed script) while holding about
# as many padded tokens (1.08x in its first batch). Prefixes are used where both passes together hold at most this
# fraction of the whole batch's padded tokens.
PAYS = 0.6


def new_cache(model, batch: int):
    """An empty KV cache for ``batch`` sequences (the class moved between TransformerLens versions)."""
    try:
        from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache as Cache
    except ImportError:  # older TransformerLens
        from transformer_lens.past_key_value_caching import HookedTransformerKeyValueCache as Cache
    return Cache.init_cache(model.cfg, model.cfg.device, batch)


def enabled() -> bool:
    from workbench.models.fused_attention import env_switch

    return env_switch(SWITCH, "compute a shared prompt prefix once", "every row whole")


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every row shares, leaving each row at least one token of its own (a pass needs a
    query position)."""
    if not rows:
        return 0
    shortest, first = min(len(r) for r in rows), rows[0]
    n = 0
    while n < shortest - 1 and all(r[n] == first[n] for r in rows):
        n += 1
    return n


def _runs(rows: Sequence[Sequence[int]], order: Sequence[int]) -> list[list[int]]:
    """``order`` cut into runs of consecutive rows sharing at least ``MIN_PREFIX`` tokens more than all of them do."""
    if not order:
        return []
    floor = common_prefix_length([rows[i] for i in order]) + MIN_PREFIX
    runs = [[order[0]]]
    for i in order[1:]:
        if common_prefix_length([rows[runs[-1][0]], rows[i]]) >= floor:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def batch_order(rows: Sequence[Sequence[int]]) -> list[int]:
    """The order to batch token ``rows`` in: shortest first (a batch pads little), rows of equal length by their
    tokens (so equal-length rows sharing a prefix sit together). Every caller that must reproduce another's batches
    (a Ray worker's slice) uses this one order."""
    return sorted(range(len(rows)), key=lambda i: (len(rows[i]), rows[i]))


def prefix_groups(rows: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """For the rows of one batch: each row's group and each group's prefix length. Rows sharing at least
    ``MIN_PREFIX`` tokens more than the whole batch does form a group of their own (what they share, leaving each a
    token of its own); the other rows form one group sharing what the whole batch shares."""
    common = common_prefix_length(rows)
    runs = _runs(rows, sorted(range(len(rows)), key=lambda i: rows[i]))
    lone = [i for run in runs if len(run) == 1 for i in run]
    groups = [run for run in runs if len(run) > 1] + ([lone] if lone else [])
    group_of, lengths = [0] * len(rows), []
    for g, members in enumerate(groups):
        lengths.append(common if members is lone else common_prefix_length([rows[i] for i in members]))
        for i in members:
            group_of[i] = g
    return group_of, lengths


def serves(model, names: Sequence) -> bool:
    """Whether a pass of ``model`` hooking ``names`` may run on cached prefixes (a TransformerLens model, read-only
    hooks at ``POSITION_SITES``, ``WORKBENCH_SHARED_PREFIX`` not 0)."""
    return (hasattr(model, "run_with_hooks") and all(isinstance(n, str) and POSITION_SITES.match(n) for n in names)
            and enabled())


def _gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[b, index[b, t], ...]`` for a ``[B, T]`` index."""
    flat = x.reshape(x.shape[0], x.shape[1], -1)
    picked = flat.gather(1, index[..., None].expand(-1, -1, flat.shape[2]))
    return picked.reshape(x.shape[0], index.shape[1], *x.shape[2:])


def forward_on_prefixes(model, tokens: torch.Tensor, lengths: Sequence[int], fwd_hooks: Sequence,
                        stop: type[BaseException]) -> bool:
    """``tokens [batch, pos]`` (right-padded rows of ``lengths``) through ``model`` with read-only ``fwd_hooks``,
    each group of rows' shared prefix computed once. Returns False, having run nothing, where that saves nothing.
    Each hook sees its site's whole ``[batch, pos, ...]`` activation (pads after ``lengths`` hold no meaning). The
    pass ends once every hooked site has fired (later layers cannot change what the hooks see), or earlier where a
    hook raises ``stop``."""
    from workbench.models.fused_attention import fused_attention

    rows = [tokens[i, : int(n)].tolist() for i, n in enumerate(lengths)]
    group_of, prefix = prefix_groups(rows)
    rest_width = max(int(n) - prefix[k] for n, k in zip(lengths, group_of, strict=True))
    padded_tokens = len(prefix) * max(prefix) + len(rows) * rest_width  # both passes, pads included
    if min(prefix) < 1 or padded_tokens > PAYS * len(rows) * max(len(r) for r in rows):
        return False  # a row whose group shares nothing, or too little shared to pay for a second pass
    table = getattr(getattr(model.blocks[0], "attn", None), "rotary_cos", None)
    if table is not None and max(prefix) + rest_width > table.shape[0]:
        return False  # cache slots past the rotary table would make TransformerLens rebuild it (in float32)
    names = tuple(dict.fromkeys(name for name, _ in fwd_hooks))
    device, batch, width = tokens.device, len(rows), tokens.shape[1]
    starts = [next(i for i, g in enumerate(group_of) if g == k) for k in range(len(prefix))]
    # Prefixes are left-padded, so that a key's distance to a query in cache slots is its distance in the text
    # (sliding windows count slots); the mask keeps the pads out and positions come from it.
    width_p = max(prefix)
    head = torch.zeros(len(prefix), width_p, dtype=torch.long, device=device)
    head_mask = torch.zeros_like(head)
    for k, (i, n) in enumerate(zip(starts, prefix, strict=True)):
        head[k, width_p - n:], head_mask[k, width_p - n:] = tokens[i, :n], 1

    # 1. one row per group: its prefix's keys and values, and its activations at the hooked sites
    before: dict = {}

    def record(act, hook):
        before[hook.name] = act.detach()
        if len(before) == len(names):
            raise stop

    cache = new_cache(model, len(prefix))
    with fused_attention(model, names), contextlib.suppress(stop):
        model.run_with_hooks(head, fwd_hooks=[(n, record) for n in names], past_kv_cache=cache,
                             attention_mask=head_mask, return_type=None)

    # 2. each row's own tokens on its group's cache, masked to the group's prefix
    g = torch.tensor(group_of, device=device)
    p = torch.tensor(prefix, device=device)[g]  # per row
    n_rest = torch.tensor([int(n) for n in lengths], device=device) - p
    at = torch.arange(rest_width, device=device)[None, :] + p[:, None]
    rest = tokens.gather(1, at.clamp(max=width - 1))
    real = torch.arange(rest_width, device=device)[None, :] < n_rest[:, None]  # a pad's position stays in range
    rows_cache = dataclasses.replace(
        cache, frozen=True, previous_attention_mask=head_mask[g].to(cache.previous_attention_mask.device),
        entries=[dataclasses.replace(e, frozen=True, past_keys=e.past_keys[g.to(e.past_keys.device)],
                                     past_values=e.past_values[g.to(e.past_values.device)])
                 for e in cache.entries])
    t = torch.arange(width, device=device)[None, :]
    from_prefix = t < p[:, None]  # where a row's whole activation comes from its group's prefix pass
    in_prefix = (t + width_p - p[:, None]).clamp(0, width_p - 1)  # a prefix token's slot in its group's row
    in_rest = (t - p[:, None]).clamp(0, rest_width - 1)
    fired: set[str] = set()

    def whole(fn):
        def hook(act, hook):
            pre = before[hook.name].to(act.device, act.dtype)[g.to(act.device)]
            mask = from_prefix.to(act.device).reshape(batch, width, *([1] * (act.dim() - 2)))
            full = torch.where(mask, _gather_rows(pre, in_prefix.to(act.device)),
                               _gather_rows(act, in_rest.to(act.device)))
            if fn(full, hook=hook) is not None:
                raise WorkbenchError(f"a hook at {hook.name} edits activations: it cannot run on a shared prefix")
            fired.add(hook.name)
            if len(fired) == len(names):  # the layers after this one were never computed for the prefixes
                raise stop
        return hook

    with fused_attention(model, names), contextlib.suppress(stop):
        model.run_with_hooks(rest, fwd_hooks=[(name, whole(fn)) for name, fn in fwd_hooks], past_kv_cache=rows_cache,
                             attention_mask=real.to(torch.int), return_type=None)
    return True
