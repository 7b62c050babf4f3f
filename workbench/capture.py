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
import numbers
from collections.abc import Iterable
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.store import ActivationStore

log = logging.getLogger(__name__)

POSITIONS = ("last", "mean", "span", "all")
_UNINDEXED = ("hook_pattern", "hook_attn_scores")  # (batch, head, query, key): no single position axis


class StopForward(Exception):
    """Raised inside a hook once it has what it needs: ``forward_until_stopped`` ends the pass there."""


def forward_until_stopped(model, tokens, fwd_hooks, lengths=None) -> None:
    """Run ``tokens`` through ``model`` with ``fwd_hooks`` until a hook raises ``StopForward`` (or the pass ends).

    The layers after the last site that matters are never computed; TransformerLens removes the hooks either way.
    Attention runs fused where that is exact and no hook reads its internals (``models.fused_attention``). Given
    the rows' ``lengths`` (right-padded), prefixes that rows share are computed once where the hooks allow it
    (``models.kv_cache.forward_on_prefixes``); the hooks see the same whole activations either way.
    """
    from workbench.models.fused_attention import fused_attention
    from workbench.models.kv_cache import forward_on_prefixes, serves

    names = [name for name, _ in fwd_hooks]
    if lengths is not None and serves(model, names) and forward_on_prefixes(model, tokens, lengths, fwd_hooks,
                                                                            StopForward):
        return
    with fused_attention(model, names), contextlib.suppress(StopForward):
        model.run_with_hooks(tokens, fwd_hooks=fwd_hooks, return_type=None)


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


_SCALARS = (str, int, float, bool, type(None))


def check_span(span, text: str, where: str = "span") -> tuple[int, int]:
    """``[start, end]`` as two integers with 0 <= start < end <= len(text), or a one-line error."""
    ok = (isinstance(span, (list, tuple)) and len(span) == 2
          and all(isinstance(x, int) and not isinstance(x, bool) for x in span) and 0 <= span[0] < span[1] <= len(text))
    if not ok:
        raise WorkbenchError(f"{where}: expected two integers [start, end] with 0 <= start < end <= {len(text)} "
                             f"(the text's length), got {span!r}")
    return span[0], span[1]


def _check_record(record: dict, where: str) -> None:
    """What would fail later, refused now: a missing/empty text, a bad span or label, an unencodable string."""
    text = record.get("text")
    if not isinstance(text, str):
        raise WorkbenchError(f"{where} has no 'text' string field: every record needs one")
    if not text:
        raise WorkbenchError(f"{where} has an empty 'text': remove it or give it content")
    if "span" in record:
        check_span(record["span"], text, f"{where}: 'span'")
    if not isinstance(record.get("label"), _SCALARS):
        raise WorkbenchError(f"{where}: 'label' must be a string or number, got {type(record['label']).__name__}")
    try:
        json.dumps(record, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise WorkbenchError(f"{where} holds a lone surrogate ({exc.object[exc.start:exc.end]!r}), which is not "
                             "text: fix the escape (e.g. a split emoji) in that line") from None


def normalize_prompts(prompts) -> list[dict]:
    """Strings or dicts with a ``text`` field → dicts; every other field is kept as metadata."""
    records = []
    for i, prompt in enumerate(prompts):
        record = {"text": prompt} if isinstance(prompt, str) else dict(prompt)
        _check_record(record, f"prompt {i}")
        records.append(record)
    if not records:
        raise WorkbenchError("no prompts: the prompt list or file is empty")
    return records


def read_prompt_file(path: str | Path) -> list[dict]:
    """A JSONL file, one object per line with a ``text`` field and any metadata."""
    path = Path(path)
    if not path.exists():
        raise WorkbenchError(f"prompt file {path} does not exist")
    if not path.is_file():
        raise WorkbenchError(f"prompt file {path} is a folder, not a file: give a JSONL file")
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
        except (json.JSONDecodeError, RecursionError) as exc:
            msg = getattr(exc, "msg", "nested too deeply")
            raise WorkbenchError(f"{path}:{number} is not valid JSON ({msg}): one JSON object per line") from None
        if isinstance(record, list):
            raise WorkbenchError(f"{path}:{number} is a JSON array: write one JSON object per line (JSONL)")
        if not isinstance(record, dict):
            raise WorkbenchError(f"{path}:{number} has no 'text' string field: every line needs one")
        _check_record(record, f"{path}:{number}")
        records.append(record)
    if not records:
        raise WorkbenchError(f"{path} holds no prompts: it is empty")
    return records


TOKENIZATION = 2  # 2: user text is text; control tokens only from chat-template markup. Part of the prompts key.


def prompts_sha256(records: list[dict], parse_special: bool = False) -> str:
    """Key of what the model is fed: the records, each text's chat markup and how text is tokenized."""
    keyed = [{**r, "_markup": list(getattr(r.get("text"), "markup", ()))} for r in records]
    payload = {"tokenization": TOKENIZATION, "parse_special": bool(parse_special), "records": keyed}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()


def control_ids(tokenizer) -> set[int]:
    """Ids of the tokenizer's special added tokens (``<|im_start|>``, ``<bos>``): what text must not produce."""
    return {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}


def encode_text(tokenizer, text: str, parse_special: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and character offsets of text from a user or a document: control-token strings stay text."""
    enc = tokenizer(str(text), add_special_tokens=False, return_offsets_mapping=True,
                    split_special_tokens=not parse_special)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def _text_as_text(tokenizer, text: str, ids, offsets, controls, markup):
    """Re-tokenize a text whose content produced control tokens: only those inside ``markup`` stay control
    tokens; the text between them is encoded with special tokens split, offsets shifted back into place."""
    out_ids, out_offsets, pos = [], [], 0
    cuts = [(t, o) for t, o in zip(ids, offsets, strict=True)
            if t in controls and any(a <= o[0] and o[1] <= b for a, b in markup)]
    for t, (a, b) in [*cuts, (None, (len(text), len(text)))]:
        if a > pos:
            piece_ids, piece_offsets = encode_text(tokenizer, text[pos:a])
            out_ids += piece_ids
            out_offsets += [(x + pos, y + pos) for x, y in piece_offsets]
        if t is not None:
            out_ids.append(t)
            out_offsets.append((a, b))
        pos = max(pos, b)
    return out_ids, out_offsets


def tokenize(model, texts: list[str], max_tokens: int | None, parse_special: bool = False, warn: bool = True):
    """Token ids and character offsets per text (BOS by the model's convention), left-truncated to ``max_tokens``
    (None: never truncated).

    Text from users and documents is tokenized as text: a ``<|im_start|>`` typed in it is characters, not a
    turn. Only a ``ChatPrompt``'s markup (the chat template's own text) yields control tokens, or all text
    with ``parse_special`` (for text you wrote yourself). Ids are identical to plain tokenization whenever
    the content holds no control-token strings. Left truncation keeps the end of a prompt, which is where
    the last-token read-out looks; it is logged unless ``warn`` is False (the caller reports it).
    Returns (ids, offsets, truncated) as lists.
    """
    tok = model.tokenizer
    bos = model.cfg.default_prepend_bos and tok.bos_token_id is not None
    budget = None if max_tokens is None else int(max_tokens) - int(bos)
    if budget is not None and budget < 1:
        raise WorkbenchError(f"max_tokens={max_tokens} leaves no room for a prompt token: use at least {1 + int(bos)}")
    plain = [str(t) for t in texts]
    enc = tok(plain, add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=False)
    controls = set() if parse_special else control_ids(tok)
    all_ids, all_offsets, truncated, forged = [], [], [], []
    for i, (ids, offsets) in enumerate(zip(enc["input_ids"], enc["offset_mapping"], strict=True)):
        ids, offsets = list(ids), [tuple(o) for o in offsets]
        markup = getattr(texts[i], "markup", ())
        untrusted = [o for t, o in zip(ids, offsets, strict=True)
                     if t in controls and not any(a <= o[0] and o[1] <= b for a, b in markup)]
        if untrusted:
            forged.append(plain[i][untrusted[0][0]: untrusted[0][1]])
            ids, offsets = _text_as_text(tok, plain[i], ids, offsets, controls, markup)
        if budget is not None and len(ids) > budget:
            ids, offsets = ids[-budget:], offsets[-budget:]
            truncated.append(i)
        if bos:
            ids, offsets = [tok.bos_token_id, *ids], [(0, 0), *offsets]
        if not ids:
            raise WorkbenchError(f"prompt {plain[i][:40]!r} tokenizes to nothing")
        all_ids.append(ids)
        all_offsets.append(offsets)
    if forged:
        log.warning("%d prompt(s) hold control-token text such as %r outside a chat template's markup: tokenized "
                    "as plain text (parse_special / --parse-special trusts it)", len(forged), forged[0])
    if warn and truncated:
        log.warning("%d prompt(s) longer than %d tokens were left-truncated to their last %d tokens",
                    len(truncated), max_tokens, max_tokens)
    return all_ids, all_offsets, truncated


def check_max_tokens(model, max_tokens: int | None) -> int:
    """``max_tokens`` (None: the model's context) within [1 + BOS, n_ctx], or a one-line error."""
    n_ctx = model.cfg.n_ctx
    if max_tokens is None:
        return n_ctx
    low = 1 + int(bool(model.cfg.default_prepend_bos and model.tokenizer.bos_token_id is not None))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral) or not low <= max_tokens <= n_ctx:
        raise WorkbenchError(f"max_tokens={max_tokens!r} must be an integer from {low} to {n_ctx} "
                             f"(the context of {model.cfg.model_name})")
    return int(max_tokens)


def pad_batch(model, ids: list[list[int]]):
    """``LongTensor[len(ids), longest]`` of token rows, right-padded with the tokenizer's pad id (0 without one):
    under causal attention a pad never reaches a real position, so no attention mask is needed."""
    import torch

    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    tokens = torch.full((len(ids), max(len(row) for row in ids)), pad, dtype=torch.long)
    for r, row in enumerate(ids):
        tokens[r, : len(row)] = torch.tensor(row)
    return tokens


def span_masks(offsets, spans, lengths, device):
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


def store_model_identity(model, sites) -> dict:
    """What a store records of the model that filled it (name, weights, compute dtype, attention kernel): part of
    its identity, so a capture never resumes, nor is served from, a store made by other weights or in another
    dtype."""
    from workbench.models.loading import model_identity

    return {k: v for k, v in model_identity(model, sites).items() if k != "d_model"}


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
    parse_special: bool = False,
    engine: str = "local",
    workers: int | None = None,
    address: str | None = None,
    retries: int = 2,
) -> ActivationStore:
    """Capture ``sites`` for every prompt into the store at ``out``; resumes an interrupted capture.

    ``positions``: ``last`` (last real token), ``mean`` (mean over real tokens), ``span`` (mean over the
    tokens overlapping each prompt's character span ``record[span_field] = [start, end]``), or ``all``
    (every token, with token ids, offsets and row index stored beside them). ``max_tokens`` (default: the
    model's context) left-truncates longer prompts, logged and listed in the manifest. Prompt text is
    tokenized as text (control tokens only from chat-template markup) unless ``parse_special``.

    ``engine="ray"`` fills the store from ``workers`` model replicas on a Ray cluster (``address``; default: a
    local one): each replica captures whole shards and writes them, this process lists them in order. A worker
    that dies is restarted and its shard redone up to ``retries`` times; the store equals a local capture's.
    """
    import torch

    if positions not in POSITIONS:
        raise WorkbenchError(f"unknown positions {positions!r}: use one of {', '.join(POSITIONS)}")
    if batch_size < 1 or shard_rows < 1:
        raise WorkbenchError("batch_size and shard_rows must be at least 1")
    sites = check_sites(model, sites)
    records = normalize_prompts(prompts)
    if positions == "span":
        for i, r in enumerate(records):
            check_span(r.get(span_field), r["text"], f"prompt {i} needs a '{span_field}' (positions 'span')")
    store_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype)
    if store_dtype is None:
        raise WorkbenchError(f"unknown store dtype {dtype!r}: use float32, float16 or bfloat16")
    max_tokens = check_max_tokens(model, max_tokens)
    info = getattr(model, "workbench", {}) or {}
    header = {
        **store_model_identity(model, sites),
        "sites": sites,
        "positions": positions,
        "dtype": dtype,
        "max_tokens": max_tokens,
        "prompts_sha256": prompts_sha256(records, parse_special),
        "n_prompts": len(records),
        "d": {site: None for site in sites},
    }
    if info.get("splices"):  # SAEs spliced in (workbench.sae.splice) change what sites hold: part of the identity
        header["splices"] = info["splices"]
    # One writer per store: a second capture on the same --out is refused at once, naming the holder.
    spec = replica_spec(model, engine, workers, retries, out, address)  # a refused engine writes nothing
    with ActivationStore.writing(out, header, overwrite=overwrite) as store:
        if engine == "ray":
            settings = {"sites": sites, "positions": positions, "batch_size": batch_size, "max_tokens": max_tokens,
                        "store_dtype": store_dtype, "span_field": span_field, "parse_special": parse_special}
            return fill_with_ray(spec, store, records, shard_rows, "workbench.capture:chunk_shard", settings,
                                 progress, workers, address, retries)
        return _fill(model, store, records, sites, positions, batch_size, max_tokens, store_dtype, shard_rows,
                     progress, span_field, parse_special)


def _fill(model, store, records, sites, positions, batch_size, max_tokens, store_dtype, shard_rows, progress,
          span_field, parse_special=False) -> ActivationStore:
    """Append the rows ``store`` does not hold yet (the caller holds its lock)."""
    from workbench.progress import progress_bar

    start = store.n_rows
    bar = progress_bar(total=len(records), initial=start, desc=f"capture {store.manifest['model']}", unit="prompt",
                       disable=not progress or start >= len(records))
    n_truncated = 0
    try:
        for begin in range(start, len(records), shard_rows):
            tensors, rows, truncated = chunk_shard(model, records[begin : begin + shard_rows], begin, sites,
                                                   positions, batch_size, max_tokens, store_dtype, span_field,
                                                   parse_special, bar)
            n_truncated += len(truncated)
            store.append_shard(tensors, rows, truncated)
    finally:
        bar.close()
        warn_truncated(n_truncated, max_tokens)
    store.mark_complete()
    return store


FAULT = "WORKBENCH_CAPTURE_FAULT"  # tests: "<shard index>:<marker file>" kills a Ray worker once, before that shard


def replica_spec(model, engine: str, workers: int | None, retries: int, out, address: str | None = None) -> dict | None:
    """How a Ray worker rebuilds ``model`` (None for the local engine); refuses what a worker could not rebuild."""
    from workbench.cluster import ENGINES, check_address

    if engine not in ENGINES:
        raise WorkbenchError(f"unknown engine {engine!r}: use local or ray")
    if workers is not None and not (isinstance(workers, int) and workers >= 1):
        raise WorkbenchError(f"workers must be a whole number of at least 1, got {workers!r}")
    if not (isinstance(retries, int) and retries >= 0):
        raise WorkbenchError(f"retries must be a whole number of at least 0, got {retries!r}")
    if engine == "local":
        return None
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise WorkbenchError("the ray engine needs Ray: pip install 'workbench[ray]'")
    check_address(address)
    if str(out).startswith("memory://"):
        raise WorkbenchError("a memory:// store lives in one process, so Ray workers cannot write it: give a folder "
                             "or a shared URL (s3://, gs://, ...)")
    from workbench.models.loading import model_source

    info = getattr(model, "workbench", None) or {}
    if info.get("splices"):
        raise WorkbenchError("the ray engine cannot rebuild a model with SAEs spliced in: use --engine local")
    if info.get("backend"):
        raise WorkbenchError(f"the ray engine rebuilds hooked models; a {info['backend']} model captures with "
                             "--engine local")
    try:
        return model_source(model)
    except WorkbenchError:
        raise WorkbenchError("the ray engine loads the model again in every worker by name: load it with "
                             "workbench.models.load_model (or use --engine local)") from None


class CaptureWorker:
    """One model replica in a Ray worker process: captures whole shards and writes them to the store."""

    def __init__(self, spec: dict, identity: dict, threads: int | None):
        import torch

        from workbench.models.loading import load_source

        if threads:
            torch.set_num_threads(threads)
        self.model = load_source(spec)
        mine = store_model_identity(self.model, identity["sites"])
        differ = [k for k in mine if mine[k] != identity.get(k)]
        if differ:
            raise WorkbenchError(f"a Ray worker's replica of {spec['name']} differs from the driver's ({differ[0]}: worker "
                                 f"{mine[differ[0]]!r} vs {identity.get(differ[0])!r}): give workers the same "
                                 "weights and settings")

    def shard(self, out: str, index: int, begin: int, fn: str, kwargs: dict) -> dict:
        """Shard ``index`` (rows from ``begin``) made by ``fn(model, begin=begin, **kwargs)`` ("module:function",
        returning tensors, rows and truncated rows), written to the store at ``out``; returns its manifest entry."""
        tensors, rows, truncated = self.call(fn, {"begin": begin, **kwargs})
        _fault_point(index)
        return {**ActivationStore(out).write_shard(index, tensors, rows), "truncated": list(truncated)}

    def call(self, fn: str, kwargs: dict):
        """``fn(model, **kwargs)`` ("module:function") on this replica; its value goes back to the driver."""
        import importlib

        module, _, name = fn.partition(":")
        return getattr(importlib.import_module(module), name)(self.model, **kwargs)


def _fault_point(index: int) -> None:
    """With ``WORKBENCH_CAPTURE_FAULT=<index>:<marker>`` set, the first worker to reach that shard dies (SIGKILL)."""
    import os
    import signal

    at, _, marker = os.environ.get(FAULT, "").partition(":")
    if at and int(at) == index:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
        os.kill(os.getpid(), signal.SIGKILL)


def map_on_replicas(spec: dict, identity: dict, jobs: list, method: str, on_result, progress_bar, workers: int | None,
                    address: str | None, retries: int) -> None:
    """Run ``jobs`` ((key, args of ``CaptureWorker.<method>``)) on Ray actors, one model replica each (loaded from
    ``spec``, checked against ``identity``); ``on_result(key, value)`` in this process as each one returns, in the
    order they finish. A replica that dies is restarted and its job run again, up to ``retries`` times."""
    import os
    from collections import deque

    from workbench.cluster import ray_session

    todo = deque(jobs)
    if not todo:
        return
    with ray_session(address) as ray:
        gpu = spec["device"].startswith("cuda")
        have = ray.cluster_resources().get("GPU" if gpu else "CPU", 0)
        n = min(workers or max(1, int(have)), len(todo))
        if n > have:
            raise WorkbenchError(f"the Ray cluster has {have:g} {'GPU' if gpu else 'CPU'}(s) for {n} workers: "
                                 f"ask for --workers {int(have)} or fewer")
        threads = None if address else max(1, (os.cpu_count() or 1) // n)  # local: the cores shared out
        actor = ray.remote(CaptureWorker).options(num_cpus=0 if gpu else 1, num_gpus=1 if gpu else 0,
                                                  max_restarts=retries, max_task_retries=retries)
        replicas = [actor.remote(spec, identity, threads) for _ in range(n)]
        bar = progress_bar(n)
        pending: dict = {}

        def submit(replica: int) -> None:
            if todo:
                key, args = todo.popleft()
                pending[getattr(replicas[replica], method).remote(*args)] = (replica, key)

        try:
            for replica in range(n):  # two jobs queued per replica: it never waits for the driver
                submit(replica)
                submit(replica)
            while pending:
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                replica, key = pending.pop(ref)
                value = _worker_result(ray, ref, key)
                bar.update(on_result(key, value) or 0)
                submit(replica)
        finally:
            bar.close()


def fill_with_ray(spec: dict, store: ActivationStore, rows, shard_rows: int, fn: str, settings: dict,
                  progress: bool, workers: int | None, address: str | None, retries: int) -> ActivationStore:
    """Fill ``store`` with the ``rows`` it does not hold yet, one whole shard of ``shard_rows`` per job
    (``fn(model, chunk=..., begin=..., **settings)``), on model replicas (``map_on_replicas``); this process lists
    the shards in the manifest in order as they arrive.

    Any capture whose shards are a function of the model and a range of rows comes through here: ``capture``'s
    prompts (``chunk_shard``), SAE training's corpus blocks (``sae.train.block_shard``)."""
    from workbench.progress import progress_bar

    identity = {k: store.manifest.get(k) for k in ("model", "weights_sha256", "model_dtype", "attention", "sites")}
    finished: dict = {}
    n_truncated = [0]

    def on_result(index: int, entry: dict) -> int:
        finished[index] = entry
        while len(store.manifest["shards"]) in finished:
            ready = finished.pop(len(store.manifest["shards"]))
            n_truncated[0] += len(ready["truncated"])
            store.commit_shard(ready, ready.pop("truncated"))
        return entry["n_rows"]

    def bar(n: int):
        return progress_bar(total=len(rows), initial=store.n_rows, desc=f"capture {spec['name']} on {n} Ray workers",
                            unit="row", disable=not progress)

    try:
        begins = range(store.n_rows, len(rows), shard_rows)
        jobs = [(index, (str(store.path), index, begin, fn, {"chunk": rows[begin : begin + shard_rows], **settings}))
                for index, begin in enumerate(begins, start=len(store.manifest["shards"]))]
        map_on_replicas(spec, identity, jobs, "shard", on_result, bar, workers, address, retries)
    finally:
        warn_truncated(n_truncated[0], store.manifest.get("max_tokens"))
    store.drop_unlisted()  # the half-written temporaries of a worker that died
    store.mark_complete()
    return store


def _worker_result(ray, ref, key):
    """A job's value from its worker, or one line: the worker's own error, or how it died."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, WorkbenchError):
            raise WorkbenchError(str(cause)) from None
        raise WorkbenchError(f"job {key} failed in its Ray worker: {cause!r}") from None
    except ray.exceptions.RayActorError as exc:
        raise WorkbenchError(f"the Ray worker running job {key} died and its retries ran out "
                             f"({type(exc).__name__}): what was stored is kept; run again to resume") from None


def warn_truncated(n_truncated: int, max_tokens: int) -> None:
    if n_truncated:
        log.warning("%d prompt(s) longer than %d tokens were left-truncated (listed in the manifest)",
                    n_truncated, max_tokens)


def chunk_shard(model, chunk, begin, sites, positions, batch_size, max_tokens, store_dtype, span_field,
                parse_special=False, bar=None) -> tuple[dict, list[dict], list[int]]:
    """One shard's tensors for the prompts ``chunk`` (rows ``begin`` onwards), its rows, and which were truncated.

    The chunk's prompts run shortest first (``models.kv_cache.batch_order``), so a batch pads to a similar length
    (the probe's prompts in file order padded 36% more tokens than they hold; sorted within 1,024 rows, 0.6%); a
    prefix a batch's prompts share is computed once where that pays (``forward_until_stopped``). Their rows are
    written back in file order: the store, its resume and its workers do not see the order they ran in.
    """
    import torch

    from workbench.models.kv_cache import batch_order

    device = model.cfg.device
    ids, offsets, truncated = tokenize(model, [r["text"] for r in chunk], max_tokens, parse_special, warn=False)
    order = batch_order(ids)
    rows: list = [None] * len(chunk)  # per prompt: {site: activations, and token data for "all"}
    for at in range(0, len(order), batch_size):
        picked = order[at : at + batch_size]
        lengths = [len(ids[i]) for i in picked]
        tokens = pad_batch(model, [ids[i] for i in picked]).to(device)
        length_t = torch.tensor(lengths, device=device)
        real = torch.arange(tokens.shape[1], device=device)[None, :] < length_t[:, None]
        mask = span_masks([offsets[i] for i in picked], [chunk[i][span_field] for i in picked], lengths,
                          device) if positions == "span" else real
        got = run_sites(model, tokens, sites, positions, length_t, mask)
        per_row = {site: (got[site].split(lengths) if positions == "all" else got[site].unbind(0))
                   for site in sites}
        for j, i in enumerate(picked):
            rows[i] = {site: per_row[site][j].to("cpu", store_dtype) for site in sites}
            if positions == "all":
                rows[i]["token_ids"] = tokens[j, : lengths[j]].cpu()
        if bar is not None:
            bar.update(len(picked))
    parts: dict[str, list] = {}
    for i, row in enumerate(rows):  # file order
        for site in sites:
            parts.setdefault(site, []).append(row[site] if positions == "all" else row[site][None])
        if positions == "all":
            n = len(row["token_ids"])
            parts.setdefault("row_index", []).append(torch.full((n,), begin + i, dtype=torch.long))
            parts.setdefault("token_ids", []).append(row["token_ids"])
            parts.setdefault("offsets", []).append(torch.tensor(offsets[i], dtype=torch.long).reshape(-1, 2))
    return {k: torch.cat(v) for k, v in parts.items()}, list(chunk), list(truncated)


def run_sites(model, tokens, sites, positions, lengths, mask):
    """One forward pass; returns {site: reduced activations}, stopping once every site has fired (prefixes that
    rows share computed once, see ``forward_until_stopped``).

    A model of another backend (``site_activations``, e.g. nnsight's) returns whole site tensors, reduced here the
    same way."""
    import torch

    last = lengths - 1
    if hasattr(model, "site_activations"):
        acts = model.site_activations(tokens, sites)
        return {site: reduce_positions(acts[site], positions, last, mask) for site in sites}
    got: dict = {}

    def hook(act, hook):
        got[hook.name] = reduce_positions(act, positions, last, mask)
        if len(got) == len(sites):
            raise StopForward

    with torch.inference_mode():
        forward_until_stopped(model, tokens, [(site, hook) for site in sites], lengths.tolist())
    missing = [s for s in sites if s not in got]
    if missing:
        raise WorkbenchError(f"sites {missing} never fired during the forward pass: are they used by this model?")
    return got


def reduce_positions(act, positions: str, last, mask):
    """A site's [batch, pos, ...] activations reduced over positions: the last real token, every real token, or the
    mean over the mask (all real tokens, or a span). Indices go to the site's device (a model split over GPUs has
    several)."""
    import torch

    flat = act.reshape(act.shape[0], act.shape[1], -1).float()
    if positions == "last":
        rows = torch.arange(act.shape[0], device=act.device)
        value = flat[rows, last.to(act.device)]
    elif positions == "all":
        value = flat[mask.to(act.device)]
    else:
        weights = mask.to(act.device, flat.dtype)
        value = (flat * weights[..., None]).sum(1) / weights.sum(1, keepdim=True)
    return value.reshape(value.shape[0], *act.shape[2:]).detach()
