"""Run prompts through a hooked model and stream chosen activations to an ActivationStore.

Only the requested sites are hooked, each hook reduces positions right away
(last token, span mean, or all tokens), and the forward pass is abandoned as
soon as every requested site has fired, so nothing past the deepest site is
computed. Prompts are right-padded: in a causal model a real token never sees
a pad, so batching cannot change results, and pads are excluded from every
reduction by their lengths.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.store import ActivationStore

log = logging.getLogger(__name__)

POSITIONS = ("last", "mean", "span", "all")
_UNINDEXED = ("hook_pattern", "hook_attn_scores")  # (batch, head, query, key): no single position axis


class _AllSitesCaptured(Exception):
    """Raised inside the last hook to stop the forward pass early."""


def check_sites(model, sites: Iterable[str]) -> list[str]:
    """Validate hook names; an unknown one fails with the closest valid names."""
    sites = [s.strip() for s in sites if s and s.strip()]
    if not sites:
        raise WorkbenchError("no sites given: name at least one hook, e.g. blocks.0.hook_resid_post")
    valid = model.hook_dict
    for site in sites:
        if site not in valid:
            close = difflib.get_close_matches(site, list(valid), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else "see `workbench sites --model ...`"
            raise WorkbenchError(f"unknown site {site!r} for {model.cfg.model_name} ({model.cfg.n_layers} layers): {hint}")
        if site.endswith(_UNINDEXED):
            raise WorkbenchError(f"site {site!r} has no single position axis: capture hook_z or hook_result instead")
    return list(dict.fromkeys(sites))


def resid_sites(model, layers: Iterable[int] | None = None, kind: str = "hook_resid_post") -> list[str]:
    """``blocks.{L}.hook_resid_post`` for the given layers (all by default); out-of-range layers fail clearly."""
    n = model.cfg.n_layers
    layers = list(range(n)) if layers is None else list(layers)
    bad = [L for L in layers if not -n <= L < n]
    if bad:
        raise WorkbenchError(f"layer {bad[0]} is out of range: {model.cfg.model_name} has layers 0..{n - 1}")
    return [f"blocks.{L % n}.{kind}" for L in layers]


def normalize_prompts(prompts) -> list[dict]:
    """Strings or dicts with a ``text`` field → dicts; every other field is kept as metadata."""
    records = []
    for i, prompt in enumerate(prompts):
        record = {"text": prompt} if isinstance(prompt, str) else dict(prompt)
        text = record.get("text")
        if not isinstance(text, str):
            raise WorkbenchError(f"prompt {i} has no 'text' string field: every record needs one")
        if not text:
            raise WorkbenchError(f"prompt {i} has an empty 'text': remove it or give it content")
        records.append(record)
    if not records:
        raise WorkbenchError("no prompts: the prompt list or file is empty")
    return records


def read_prompt_file(path: str | Path) -> list[dict]:
    """A JSONL file, one object per line with a ``text`` field and any metadata."""
    path = Path(path)
    if not path.exists():
        raise WorkbenchError(f"prompt file {path} does not exist")
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise WorkbenchError(f"{path} is not UTF-8 (byte {exc.start}): re-save it as UTF-8") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkbenchError(f"{path}:{number} is not valid JSON ({exc.msg}): one JSON object per line") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise WorkbenchError(f"{path}:{number} has no 'text' string field: every line needs one")
        records.append(record)
    if not records:
        raise WorkbenchError(f"{path} holds no prompts: it is empty")
    return records


def prompts_sha256(records: list[dict]) -> str:
    return hashlib.sha256(json.dumps(records, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def tokenize(model, texts: list[str], max_tokens: int):
    """Token ids and character offsets per text (BOS by the model's convention), left-truncated to ``max_tokens``.

    Left truncation keeps the end of a prompt, which is where the last-token read-out looks.
    Returns (ids, offsets, truncated) as lists.
    """
    tok = model.tokenizer
    enc = tok(texts, add_special_tokens=False, return_offsets_mapping=True)
    bos = model.cfg.default_prepend_bos and tok.bos_token_id is not None
    all_ids, all_offsets, truncated = [], [], []
    for i, (ids, offsets) in enumerate(zip(enc["input_ids"], enc["offset_mapping"], strict=True)):
        ids, offsets = list(ids), [tuple(o) for o in offsets]
        budget = max_tokens - int(bos)
        if len(ids) > budget:
            ids, offsets = ids[-budget:], offsets[-budget:]
            truncated.append(i)
        if bos:
            ids, offsets = [tok.bos_token_id, *ids], [(0, 0), *offsets]
        if not ids:
            raise WorkbenchError(f"prompt {texts[i][:40]!r} tokenizes to nothing")
        all_ids.append(ids)
        all_offsets.append(offsets)
    return all_ids, all_offsets, truncated


def _span_masks(offsets, spans, lengths, device):
    """Token mask of each row's character span [start, end): tokens whose characters overlap it."""
    import torch

    mask = torch.zeros(len(offsets), max(lengths), dtype=torch.bool, device=device)
    for r, (offs, span) in enumerate(zip(offsets, spans, strict=True)):
        start, end = span
        for t, (a, b) in enumerate(offs):
            if b > a and a < end and b > start:
                mask[r, t] = True
        if not mask[r].any():
            raise WorkbenchError(f"the span {span} of a prompt covers no token (truncated away?): check its 'span' field")
    return mask


def capture(
    model,
    prompts,
    sites: Iterable[str],
    out: str | Path,
    positions: str = "last",
    batch_size: int = 8,
    max_tokens: int | None = None,
    dtype: str = "float32",
    shard_rows: int = 1024,
    overwrite: bool = False,
    progress: bool = True,
    span_field: str = "span",
) -> ActivationStore:
    """Capture ``sites`` for every prompt into the store at ``out``; resumes an interrupted capture.

    ``positions``: ``last`` (last real token), ``mean`` (mean over real tokens), ``span`` (mean over the
    tokens overlapping each prompt's character span ``record[span_field] = [start, end]``), or ``all``
    (every token, with token ids, offsets and row index stored beside them).
    """
    import torch
    from tqdm.auto import tqdm

    if positions not in POSITIONS:
        raise WorkbenchError(f"unknown positions {positions!r}: use one of {', '.join(POSITIONS)}")
    if batch_size < 1 or shard_rows < 1:
        raise WorkbenchError("batch_size and shard_rows must be at least 1")
    sites = check_sites(model, sites)
    records = normalize_prompts(prompts)
    if positions == "span":
        for i, r in enumerate(records):
            span = r.get(span_field)
            if not (isinstance(span, (list, tuple)) and len(span) == 2 and 0 <= span[0] < span[1] <= len(r["text"])):
                raise WorkbenchError(f"prompt {i} needs a '{span_field}': [start, end] character span within its text")
    store_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype)
    if store_dtype is None:
        raise WorkbenchError(f"unknown store dtype {dtype!r}: use float32, float16 or bfloat16")
    max_tokens = int(max_tokens or model.cfg.n_ctx)
    info = getattr(model, "workbench", {}) or {}
    header = {
        "model": info.get("name", model.cfg.model_name),
        "weights_sha256": info.get("weights_sha256"),
        "sites": sites,
        "positions": positions,
        "dtype": dtype,
        "max_tokens": max_tokens,
        "prompts_sha256": prompts_sha256(records),
        "n_prompts": len(records),
        "d": {site: None for site in sites},
    }
    store = ActivationStore.create_or_resume(out, header, overwrite=overwrite)
    start = store.n_rows
    if start >= len(records):
        store.mark_complete()
        return store

    device = model.cfg.device
    bar = tqdm(total=len(records), initial=start, desc=f"capture {header['model']}", unit="prompt",
               disable=not progress)
    buffer: dict[str, list] = {}
    buffer_rows: list[dict] = []
    buffer_truncated: list[int] = []
    n_truncated = 0

    def flush():
        if not buffer_rows:
            return
        tensors = {k: torch.cat(v) for k, v in buffer.items()}
        if positions == "all":  # row indices were shard-relative while buffering
            tensors["row_index"] = tensors["row_index"] + store.n_rows
        if store.manifest["d"][sites[0]] is None:
            store.manifest["d"] = {s: list(tensors[s].shape[1:]) for s in sites}
        store.append_shard(tensors, list(buffer_rows), buffer_truncated)
        buffer.clear()
        buffer_rows.clear()
        buffer_truncated.clear()

    try:
        for begin in range(start, len(records), batch_size):
            batch = records[begin : begin + batch_size]
            ids, offsets, truncated = tokenize(model, [r["text"] for r in batch], max_tokens)
            n_truncated += len(truncated)
            lengths = [len(x) for x in ids]
            pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
            tokens = torch.full((len(ids), max(lengths)), pad, dtype=torch.long)
            for r, row in enumerate(ids):
                tokens[r, : len(row)] = torch.tensor(row)
            tokens = tokens.to(device)
            length_t = torch.tensor(lengths, device=device)
            real = torch.arange(tokens.shape[1], device=device)[None, :] < length_t[:, None]
            mask = _span_masks(offsets, [r[span_field] for r in batch], lengths, device) if positions == "span" else real
            got = run_sites(model, tokens, sites, positions, length_t, mask)
            shard_base = len(buffer_rows)
            for site in sites:
                buffer.setdefault(site, []).append(got[site].to("cpu", store_dtype))
            if positions == "all":
                rows_of_tokens = torch.arange(len(batch))[:, None].expand_as(real.cpu())[real.cpu()] + shard_base
                buffer.setdefault("row_index", []).append(rows_of_tokens)
                buffer.setdefault("token_ids", []).append(tokens.cpu()[real.cpu()])
                flat_offsets = [o for offs in offsets for o in offs]
                buffer.setdefault("offsets", []).append(torch.tensor(flat_offsets, dtype=torch.long).reshape(-1, 2))
            buffer_truncated.extend(shard_base + t for t in truncated)
            buffer_rows.extend(batch)
            bar.update(len(batch))
            if len(buffer_rows) >= shard_rows:
                flush()
        flush()
    finally:
        bar.close()
        if n_truncated:
            log.warning("%d prompt(s) longer than %d tokens were left-truncated (listed in the manifest)",
                        n_truncated, max_tokens)
    store.mark_complete()
    return store


def run_sites(model, tokens, sites, positions, lengths, mask):
    """One forward pass; returns {site: reduced activations}, stopping once every site has fired."""
    import torch

    got: dict = {}
    last = lengths - 1
    rows = torch.arange(tokens.shape[0], device=tokens.device)

    def hook(act, hook):
        flat = act.reshape(act.shape[0], act.shape[1], -1).float()
        if positions == "last":
            value = flat[rows, last]
        elif positions == "all":
            value = flat[mask]
        else:
            weights = mask.to(flat.dtype)
            value = (flat * weights[..., None]).sum(1) / weights.sum(1, keepdim=True)
        got[hook.name] = value.reshape(value.shape[0], *act.shape[2:]).detach()
        if len(got) == len(sites):
            raise _AllSitesCaptured

    with torch.inference_mode(), contextlib.suppress(_AllSitesCaptured):
        model.run_with_hooks(tokens, fwd_hooks=[(site, hook) for site in sites], return_type=None)
    missing = [s for s in sites if s not in got]
    if missing:
        raise WorkbenchError(f"sites {missing} never fired during the forward pass: are they used by this model?")
    return got
