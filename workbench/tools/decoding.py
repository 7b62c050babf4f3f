"""The one KV-cached decoding loop that generation and sparse-attention evaluation share.

Both feed tokens through a TransformerLens model one step at a time with hooks active and a
KV cache carrying the past; they differ only in what is fed next (a sampled token, or the
next token of a known text). ``decode_loop`` owns the loop, the hook context and the cache
calls; the caller's ``choose`` decides what comes next and when to stop. Keeping one loop
means a fix to caching or hook handling reaches every caller at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Choose = Callable[[int, torch.Tensor], torch.Tensor | None]


def prefill(model, tokens: torch.Tensor, cache, chunk: int | None = None) -> torch.Tensor:
    """Run ``tokens [b, n]`` into ``cache``, ``chunk`` positions per forward (None: one forward).

    Chunks bound the memory of long contexts; the cache makes the result that of one pass.
    Returns the float logits ``[b, vocab]`` at the last position (what the next token is drawn from).
    """
    width = chunk or tokens.shape[1]
    for start in range(0, tokens.shape[1], width):
        logits = model(tokens[:, start : start + width], past_kv_cache=cache)
    return logits[:, -1].float()


def step(model, token: torch.Tensor, cache) -> torch.Tensor:
    """One decode step: ``token [b, 1]`` through the model on ``cache`` -> float logits ``[b, vocab]``."""
    return model(token, past_kv_cache=cache)[:, -1].float()


def decode_loop(model, cache, first: torch.Tensor, choose: Choose, hooks: Sequence = (),
                chunk: int | None = None) -> None:
    """Prefill ``first`` into ``cache``, then feed whatever ``choose(i, logits)`` returns until it returns None.

    ``choose`` gets the step index (0 after the prefill) and the logits ``[b, vocab]`` of the last
    position fed, and returns the next tokens ``[b, 1]`` or None to stop. ``hooks`` (``(name, fn)``
    pairs) are active throughout, prefill included, under ``torch.inference_mode``; they are
    installed once for the whole loop, not per step.
    """
    with torch.inference_mode(), model.hooks(fwd_hooks=list(hooks)):
        logits = prefill(model, first, cache, chunk)
        i = 0
        while (nxt := choose(i, logits)) is not None:
            logits = step(model, nxt, cache)
            i += 1
