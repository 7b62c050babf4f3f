"""Load any model as a TransformerLens ``HookedTransformer``, offline first.

Weights are loaded without TransformerLens's reparametrisations (no LayerNorm
folding, no weight centering): activations at ``blocks.{L}.hook_resid_post`` are
the model's own hidden states, so what topology or an SAE finds is about the
model, not about a rewrite of it. GGUF sources are dequantized once and cached
as safetensors in the user cache, so the second load skips the slow part.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.io import build_once
from workbench.models.registry import ModelSpec, embedded_gguf, resolve
from workbench.paths import cache_dir, model_folder_name

log = logging.getLogger(__name__)

_CACHE_FORMAT = 1
_NO_PROCESSING = dict(
    fold_ln=False,
    center_writing_weights=False,
    center_unembed=False,
    fold_value_biases=False,
    refactor_factored_attn_matrices=False,
)


def pick_device(device: str = "auto") -> str:
    """``auto`` → CUDA when present, else MPS, else CPU; a named device must exist on this machine.

    Checked here, before any weights load, so a wrong ``--device`` is one line, not a torch traceback.
    """
    import torch

    cuda = torch.cuda.is_available()
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if device == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    kind, colon, index = str(device).partition(":")
    if kind not in ("cpu", "cuda", "mps") or (colon and (kind != "cuda" or not index.isdigit())):
        raise WorkbenchError(f"unknown device {device!r}: use auto, cpu, cuda, cuda:N or mps")
    available = {"cpu": True, "cuda": cuda and int(index or 0) < torch.cuda.device_count(), "mps": mps}[kind]
    if not available:
        raise WorkbenchError(f"device {device} is not available here: use --device cpu or auto")
    return device


def fast_bfloat16(device: str, cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """Whether ``device`` computes bfloat16 natively: a CUDA GPU that supports it, or a CPU with AVX512-BF16 or AMX
    (Linux's CPU flags). Elsewhere bfloat16 matmuls are emulated and slower than float32."""
    import torch

    if str(device).startswith("cuda"):
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device != "cpu":
        return False
    try:
        flags = Path(cpuinfo).read_text()
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def _torch_dtype(dtype, device: str = "cpu"):
    """``dtype`` as a torch dtype; ``auto``: bfloat16 where the device computes it natively, else float32."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if fast_bfloat16(device) else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise WorkbenchError(f"unknown dtype {dtype!r}: use auto or one of {', '.join(table)}")
    return table[dtype]


def model_identity(model, hook_names=()) -> dict:
    """What results computed from ``model`` depend on: its name, weights, compute dtype, width and the attention
    a pass with ``hook_names`` runs (``fused_attention.implementation``). Stores, cached features and detectors
    record it, so nothing computed in one dtype (or by one attention kernel) is served for another."""
    from workbench.models.fused_attention import implementation

    info = getattr(model, "workbench", {}) or {}
    return {"model": info.get("name", model.cfg.model_name), "weights_sha256": info.get("weights_sha256"),
            "model_dtype": info.get("dtype", str(model.cfg.dtype).removeprefix("torch.")),
            "d_model": int(model.cfg.d_model), "attention": implementation(model, hook_names)}


def load_model(
    name: str | None = None,
    *,
    model_path: str | Path | None = None,
    device: str = "auto",
    dtype="float32",
    trust_remote_code: bool = False,
    seed: int = 0,
):
    """Return a ``HookedTransformer`` for a registry name, HF id, local folder or ``.gguf`` file.

    ``model.workbench`` holds provenance (name, source, weights hash) that stores and reports record.
    """
    spec = resolve(name, model_path)
    device = pick_device(device)
    torch_dtype = _torch_dtype(dtype, device)
    started = time.perf_counter()
    if spec.source == "tiny":
        from workbench.models.tiny import tiny_model

        model = tiny_model(seed=seed, device=device)  # made in float32 and cast below, as a checkpoint is loaded:
        info = {"weights_sha256": state_sha256(model), "cached": False}  # one weights hash in every dtype
    elif spec.source == "derived":
        model = load_model(spec.base, device="cpu", dtype="float32", trust_remote_code=trust_remote_code, seed=seed)
        info = _apply_derived(model, spec)
    elif spec.source in ("embedded", "gguf"):
        gguf = embedded_gguf(spec) if spec.source == "embedded" else Path(spec.path)
        model, info = _load_gguf(spec, gguf)
    else:
        model, info = _load_hf(spec, trust_remote_code)
    model = _place(model, device, torch_dtype)
    model.eval()
    model.workbench = {
        "name": spec.name,
        "source": spec.source,
        "hf_id": spec.hf_id,
        "path": spec.path,
        "dtype": str(torch_dtype).removeprefix("torch."),
        "load_seconds": round(time.perf_counter() - started, 2),
        **info,
    }
    log.info("loaded %s in %.1fs (%s)", spec.name, model.workbench["load_seconds"], info)
    return model


def _apply_derived(model, spec: ModelSpec) -> dict:
    """Overwrite the base model's tensors with the derived model's (a fine-tune saves only what it changed)."""
    from safetensors.torch import load_file

    path = Path(spec.path)
    if not path.exists():
        raise WorkbenchError(f"weights of derived model {spec.name!r} are missing ({path}): re-create it")
    update = load_file(str(path))
    unknown = sorted(set(update) - set(model.state_dict()))
    if unknown:
        raise WorkbenchError(f"{path} does not fit base model {spec.base!r} (unknown tensor {unknown[0]})")
    model.load_state_dict(update, strict=False)
    model.cfg.model_name = spec.name
    return {"weights_sha256": file_sha256(path), "base": spec.base, "cached": True}


def _place(model, device, torch_dtype):
    if str(model.cfg.device) != device:
        model = model.to(device, print_details=False)
    if model.cfg.dtype != torch_dtype:
        model = model.to(torch_dtype, print_details=False)
    return model


def state_sha256(module) -> str:
    """SHA256 of a module's state dict (names and float values): the identity of weights made in memory."""
    digest = hashlib.sha256()
    for key, value in sorted(module.state_dict().items()):
        digest.update(key.encode())
        digest.update(value.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------- GGUF


def _load_gguf(spec: ModelSpec, gguf: Path):
    """Dequantize a GGUF once through transformers, then serve it from the safetensors cache.

    Two first loads at once are safe: one dequantizes and publishes the entry, the other waits and reads it.
    """
    _check_gguf(gguf)
    folder = gguf_cache_folder(spec, gguf)
    loaded: dict = {}

    def ready(entry: Path) -> bool:
        loaded["cached"] = _read_cache(entry)
        return loaded["cached"] is not None

    def build(tmp: Path) -> None:
        log.info("dequantizing %s (first load; cached afterwards in %s)", gguf, folder)
        model = _dequantize(spec, gguf)
        sha = file_sha256(gguf)
        _write_cache(tmp, model, {"weights_sha256": sha, "gguf": str(gguf), "spec": spec.name})
        loaded["built"] = model, {"weights_sha256": sha, "cached": False}

    build_once(folder, build, ready, f"the model cache {folder}")
    return loaded.get("built") or loaded["cached"]


def _check_gguf(gguf: Path) -> None:
    """A file that is not GGUF at all is refused before anything is written to the cache."""
    with open(gguf, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise WorkbenchError(f"{gguf} is not a GGUF file (it does not start with the GGUF magic bytes): "
                                 "give a complete .gguf model file")


def gguf_cache_folder(spec: ModelSpec, gguf: Path) -> Path:
    """The cache entry of a GGUF's conversion, keyed by everything that changes its content: the file (path,
    size, mtime), the cache format, the converting libraries' versions and the spec's conversion settings."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in ("transformers", "transformer-lens", "gguf", "torch"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    stat = gguf.stat()
    key = json.dumps({"gguf": str(gguf.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                      "format": _CACHE_FORMAT, "versions": versions, "tl_name": spec.tl_name,
                      "prepend_bos": spec.prepend_bos}, sort_keys=True)
    name = model_folder_name(spec.name)
    return cache_dir("models") / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _dequantize(spec: ModelSpec, gguf: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        hf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as exc:  # a truncated or unsupported file fails deep in the reader, with many types
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise WorkbenchError(f"could not read {gguf} as a GGUF model ({reason}); is it a complete, supported "
                             "file?") from None
    return _convert(spec, hf_model, tokenizer)


def _write_cache(folder: Path, model, meta: dict) -> None:
    """Write the converted model into ``folder`` (a fresh temporary one that ``build_once`` publishes)."""
    import torch
    from safetensors.torch import save_file

    state = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    cfg = {k: v for k, v in model.cfg.to_dict().items() if k not in ("device", "dtype", "n_params")}
    (folder / "config.json").write_text(json.dumps(cfg, default=str, indent=1))
    model.tokenizer.save_pretrained(folder / "tokenizer")
    (folder / "meta.json").write_text(json.dumps({"format": _CACHE_FORMAT, **meta}, indent=1))


def _read_cache(folder: Path):
    """(model, info) from a published cache entry; None when there is none or it is stale or damaged."""
    meta_file = folder / "meta.json"
    if not meta_file.exists():
        return None
    try:
        meta = json.loads(meta_file.read_text())
        if meta.get("format") != _CACHE_FORMAT:
            return None
        import torch
        from safetensors.torch import load_file
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        from transformers import AutoTokenizer

        cfg_dict = json.loads((folder / "config.json").read_text())
        cfg = HookedTransformerConfig.from_dict({**cfg_dict, "dtype": torch.float32, "device": "cpu"})
        tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
        model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
        model.load_and_process_state_dict(load_file(str(folder / "model.safetensors")), **_NO_PROCESSING)
        return model, {"weights_sha256": meta["weights_sha256"], "cached": True}
    except Exception as exc:  # a stale or damaged cache is rebuilt, never fatal
        log.warning("model cache %s unreadable (%s); rebuilding it", folder, exc)
        return None


# ----------------------------------------------------------------------- HF


def _load_hf(spec: ModelSpec, trust_remote_code: bool):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = spec.path or spec.hf_id
    # The local cache first; the hub only when it answers, so an offline machine fails in a second, not
    # after minutes of retries.
    local_only = bool(spec.path) or not hub_reachable()
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            where, trust_remote_code=trust_remote_code, local_files_only=local_only
        )
        hf_model = AutoModelForCausalLM.from_pretrained(
            where, dtype=torch.float32, trust_remote_code=trust_remote_code, local_files_only=local_only
        )
    except Exception as exc:  # hub clients raise many types; the user needs one line either way
        raise WorkbenchError(_missing_weights_message(spec, exc, local_only)) from None
    model = _convert(spec, hf_model, tokenizer)
    revision = getattr(hf_model.config, "_commit_hash", None)
    return model, {"weights_sha256": revision or "unknown", "cached": False}


def hub_reachable(timeout: float = 3.0) -> bool:
    """False when offline mode is set or the hub does not answer an HTTP request. The request goes through
    urllib, so ``HTTPS_PROXY`` / ``NO_PROXY`` are honoured as the hub client honours them; any HTTP answer,
    an error status included, means the hub is there."""
    import urllib.error
    import urllib.request

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
        return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):  # URLError is an OSError; ValueError: an HF_ENDPOINT that is no URL
        return False


def _missing_weights_message(spec: ModelSpec, exc: Exception, offline: bool) -> str:
    reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
    if spec.path:
        return f"could not load model {spec.name!r} from {spec.path}: {reason}"
    where = "not in the Hugging Face cache and the hub is unreachable" if offline else f"not available ({reason})"
    return (
        f"weights for model {spec.name!r} ({spec.hf_id}) are {where}: "
        f"download them where there is network (`hf download {spec.hf_id}`) into the Hugging Face cache, "
        f"or pass --model-path /path/to/folder-or.gguf"
    )


def _convert(spec: ModelSpec, hf_model, tokenizer):
    """HF model → HookedTransformer, through TransformerLens's own weight converters."""
    import torch
    from transformer_lens import HookedTransformer
    from transformer_lens.loading_from_pretrained import (
        get_pretrained_model_config,
        get_pretrained_state_dict,
    )

    # Without an official name, TransformerLens derives a config from config.json in a folder; the folder's
    # name must not trip its name-based branches (e.g. "llama" in a path), so it gets a neutral one.
    config_name = spec.tl_name or str(_neutral_config_folder(hf_model))
    try:
        cfg = get_pretrained_model_config(
            config_name, dtype=torch.float32, fold_ln=False, device="cpu", default_prepend_bos=spec.prepend_bos
        )
        state = get_pretrained_state_dict(config_name, cfg, hf_model=hf_model)
    except (ValueError, NotImplementedError, AttributeError) as exc:
        arch = (getattr(hf_model.config, "architectures", None) or [type(hf_model).__name__])[0]
        raise WorkbenchError(
            f"TransformerLens cannot convert {spec.name!r} (architecture {arch}): {str(exc).splitlines()[0][:160]}"
        ) from None
    tokenizer = _portable_tokenizer(tokenizer)
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    model.load_and_process_state_dict(state, **_NO_PROCESSING)
    model.cfg.model_name = spec.name
    return model


def _neutral_config_folder(hf_model) -> Path:
    config = hf_model.config
    if not getattr(config, "architectures", None):
        config.architectures = [type(hf_model).__name__]
    digest = hashlib.sha256(config.to_json_string().encode()).hexdigest()[:16]  # the whole config: its key
    folder = cache_dir("hf-configs") / digest
    return build_once(folder, config.save_pretrained, lambda f: (f / "config.json").exists(),
                      f"the config cache {folder}")


def _portable_tokenizer(tokenizer):
    """Re-home a tokenizer in a plain folder so TransformerLens can re-load it offline (it does, for BOS).

    The folder is named by the hash of every file the tokenizer saves (vocabulary, merges, special tokens,
    chat template): two tokenizers that differ anywhere never share one.
    """
    import tempfile

    from transformers import AutoTokenizer

    name = getattr(tokenizer, "name_or_path", "") or ""
    if name and Path(name).is_dir() and not tokenizer.init_kwargs.get("gguf_file"):
        return tokenizer
    with tempfile.TemporaryDirectory() as saved:
        tokenizer.save_pretrained(saved)
        digest = hashlib.sha256()
        for file in sorted(p for p in Path(saved).rglob("*") if p.is_file()):
            digest.update(file.relative_to(saved).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")
        folder = cache_dir("tokenizers") / digest.hexdigest()[:16]
        build_once(folder, lambda tmp: shutil.copytree(saved, tmp, dirs_exist_ok=True),
                   lambda f: (f / "tokenizer_config.json").exists(), f"the tokenizer cache {folder}")
    return AutoTokenizer.from_pretrained(folder)


# --------------------------------------------------------------------- chat


class ChatPrompt(str):
    """Prompt text rendered by a chat template, with the character ranges that are the template's own markup.

    Only markup may become control tokens (``<|im_start|>``, ``<end_of_turn>``): message contents, from users
    and documents, are tokenized as text (``workbench.capture.tokenize``), so a document cannot forge a turn.
    Adding plain text on either side keeps the ranges (the added text is content); any other string operation
    gives a plain ``str``, which is all content.
    """

    markup: tuple[tuple[int, int], ...]

    def __new__(cls, text: str, markup=()):
        self = super().__new__(cls, text)
        self.markup = tuple((int(a), int(b)) for a, b in markup if b > a)
        return self

    def __getnewargs__(self):
        return str(self), self.markup

    def __add__(self, other):
        if not isinstance(other, str):
            return NotImplemented
        n = len(self)
        return ChatPrompt(str(self) + other, self.markup + tuple((a + n, b + n) for a, b in getattr(other, "markup", ())))

    def __radd__(self, other):
        if not isinstance(other, str):
            return NotImplemented
        n = len(other)
        return ChatPrompt(other + str(self), tuple((a + n, b + n) for a, b in self.markup))


def has_chat_template(model) -> bool:
    return getattr(model.tokenizer, "chat_template", None) is not None


def format_chat(model, user: str, system: str | None = None, history: list[dict] | None = None) -> ChatPrompt:
    """The prompt for one user turn through the model's own chat template (generation prompt added).

    ``system`` and ``history`` contents are content too: only the template's markup is trusted.
    """
    messages = ([{"role": "system", "content": system}] if system else []) + list(history or [])
    messages.append({"role": "user", "content": user})
    return _render_chat(model, messages)[0]


def chat_record(model, record: dict | str, system: str | None = None) -> dict:
    """A prompt record in the chat template: ``text`` becomes a ``ChatPrompt``, the original moves to
    ``raw_text``, and a character ``span`` moves with the text (clipped to what the template keeps of it).

    The one wrapper every caller uses (capture, detect, generate, the probe), so spans and trust agree.
    """
    from workbench.capture import check_span

    record = {"text": record} if isinstance(record, str) else dict(record)
    user = record.get("text")
    if not isinstance(user, str) or not user:
        raise WorkbenchError("a chat prompt needs a non-empty 'text' string")
    text, where = _render_chat(model, ([{"role": "system", "content": system}] if system else [])
                               + [{"role": "user", "content": user}])
    start, end = where[-1]
    out = {**record, "text": text, "raw_text": user}
    if "span" in record:
        a, b = check_span(record["span"], user)
        shown = text[start:end]
        lead = 0 if shown == user else user.find(shown) if shown else -1
        a, b = max(a, lead), min(b, lead + len(shown))
        if lead < 0 or a >= b:
            raise WorkbenchError(f"the chat template of {model.cfg.model_name!r} drops the text of span "
                                 f"{record['span']}: use raw text (--raw) or a span inside the kept text")
        out["span"] = [a - lead + start, b - lead + start]
    return out


def chat_records(model, records: list[dict], chat: bool = True) -> list[dict]:
    """``records`` in the model's chat template when ``chat`` and it has one (each through ``chat_record``,
    marked ``chat_formatted`` so a second call leaves them alone); otherwise unchanged."""
    if not chat or not has_chat_template(model):
        return list(records)
    return [r if r.get("chat_formatted") else {**chat_record(model, r), "chat_formatted": True} for r in records]


def _render_chat(model, messages: list[dict]) -> tuple[ChatPrompt, list[tuple[int, int]]]:
    """The rendered prompt and where each message's content lies in it.

    Each content is located by rendering it between unique sentinels standing in for the others, so
    content equal to template text (a user who types "user") or rewritten by it (``| trim``) is found
    exactly; a template whose layout depends on the contents is refused rather than guessed at.
    """
    import secrets

    if not has_chat_template(model):
        raise WorkbenchError(
            f"model {model.cfg.model_name!r} has no chat template: pass raw text instead (e.g. --raw)"
        )
    for m in messages:
        if not isinstance(m.get("content"), str):
            raise WorkbenchError(f"chat message {m.get('role')!r} needs a string 'content'")
    marks = [f"WB{secrets.token_hex(8)}M{i}" for i in range(len(messages))]

    def render(*real: int) -> str:  # the contents of messages ``real``, sentinels for the others
        shown = [dict(m, content=m["content"] if i in real else marks[i]) for i, m in enumerate(messages)]
        return model.tokenizer.apply_chat_template(shown, tokenize=False, add_generation_prompt=True)

    skeleton = render()
    at = [skeleton.find(mark) for mark in marks]
    if any(skeleton.count(mark) != 1 for mark in marks) or at != sorted(at):
        raise WorkbenchError(f"the chat template of {model.cfg.model_name!r} does not show each message once, "
                             "in order: pass raw text (--raw)")
    text, where, markup, pos = "", [], [], 0
    for i, mark in enumerate(marks):
        before, after = skeleton[: at[i]], skeleton[at[i] + len(mark):]
        alone = render(i)
        if not (alone.startswith(before) and alone.endswith(after) and len(alone) >= len(before) + len(after)):
            raise WorkbenchError(f"the chat template of {model.cfg.model_name!r} lays out a message depending on "
                                 "its content: pass raw text (--raw)")
        shown = alone[len(before): len(alone) - len(after)]
        markup.append((len(text), len(text) + at[i] - pos))
        text += skeleton[pos: at[i]]
        where.append((len(text), len(text) + len(shown)))
        text += shown
        pos = at[i] + len(mark)
    markup.append((len(text), len(text) + len(skeleton) - pos))
    text += skeleton[pos:]
    if text != render(*range(len(messages))):
        raise WorkbenchError(f"the chat template of {model.cfg.model_name!r} renders messages together in a way "
                             "that cannot be located: pass raw text (--raw)")
    return ChatPrompt(text, markup), where
