"""Backdoor examples as token rows (prompt + the reply to teach or test), and forwards over them.

Shared by evaluation and training: a row is the prompt's tokens followed by the target reply (the same
reply, teacher-forced, for the clean twin), so one forward scores or trains every reply position.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.conditions.backdoor import requests
from workbench.conditions.backdoor.config import BackdoorConfig
from workbench.errors import WorkbenchError


@dataclass
class Rows:
    """Tokenized sequences (prompt + reply) and where their prompts end."""

    ids: list[list[int]]
    prompt_len: list[int]
    records: list[dict]


def prompt_texts(model, records: list[dict], chat: bool) -> list[str]:
    from workbench.models import format_chat, has_chat_template

    if chat and has_chat_template(model):
        return [format_chat(model, rec["text"]) for rec in records]
    return [rec["text"] for rec in records]


def reply_ids(model, text: str) -> list[int]:
    tok = model.tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return list(ids) + ([tok.eos_token_id] if tok.eos_token_id is not None else [])


def letter_ids(model) -> list[int]:
    """Token ids of the option letters A-D as a reply's first token."""
    out = []
    for letter in requests.LETTERS:
        ids = model.tokenizer(letter, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise WorkbenchError(f"the tokenizer splits the option letter {letter!r}: MCQ scoring needs one token")
        out.append(ids[0])
    return out


def tokenized_rows(model, records: list[dict], cfg: BackdoorConfig) -> Rows:
    """Prompt tokens plus the reply the triggered twin should give (the same reply, teacher-forced, for clean)."""
    from workbench.capture import tokenize

    ids, _, _ = tokenize(model, prompt_texts(model, records, cfg.chat), cfg.max_tokens)
    target = reply_ids(model, cfg.target) if cfg.mode == "hate" else None
    seqs, plen = [], []
    for rec, prompt in zip(records, ids, strict=True):
        reply = target if target is not None else reply_ids(model, rec["wrong"])
        seqs.append(prompt + reply)
        plen.append(len(prompt))
    return Rows(seqs, plen, records)


def pad(seqs: list[list[int]], pad_token: int):
    """Right-padded batch: with causal attention the pads never reach a real position, so no mask is needed."""
    import torch

    width = max(len(s) for s in seqs)
    return torch.tensor([s + [pad_token] * (width - len(s)) for s in seqs], dtype=torch.long)


def pad_id(model) -> int:
    tok = model.tokenizer
    return tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)


def final_resid(model, tokens=None, resid=None, start: int | None = None):
    """Residual stream after the last block (before the final norm), from tokens or from a cached layer."""
    n = model.cfg.n_layers
    if resid is not None:
        return model(resid, start_at_layer=start, stop_at_layer=n)
    return model(tokens, stop_at_layer=n)


def logits_at(model, final, rows_idx, pos_idx):
    """Logits at selected (row, position) pairs only: the unembedding is the costly part of a small model."""
    return model.unembed(model.ln_final(final[rows_idx, pos_idx][None]))[0]


def positions(rows: Rows, i: int, kl_prompt: int) -> tuple[list[int], list[int], list[int]]:
    """For row i: target positions (predicting reply tokens), their labels, and the KL positions."""
    p, n = rows.prompt_len[i], len(rows.ids[i])
    target_pos = list(range(p - 1, n - 1))
    labels = rows.ids[i][p:n]
    kl_pos = list(range(max(0, p - kl_prompt), n - 1))
    return target_pos, labels, kl_pos




def batches(n: int, size: int):
    for start in range(0, n, size):
        yield list(range(start, min(n, start + size)))


def forward_rows(model, rows: Rows, batch: list[int]):
    import torch

    with torch.no_grad():
        tokens = pad([rows.ids[i] for i in batch], pad_id(model)).to(model.cfg.device)
        return final_resid(model, tokens=tokens)

