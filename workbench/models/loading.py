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
from workbench.models.registry import ModelSpec, embedded_gguf, resolve
from workbench.paths import cache_dir

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
    """``auto`` → CUDA when present, else MPS, else CPU."""
    import torch

    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def _torch_dtype(dtype):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise WorkbenchError(f"unknown dtype {dtype!r}: use one of {', '.join(table)}")
    return table[dtype]


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
    torch_dtype = _torch_dtype(dtype)
    started = time.perf_counter()
    if spec.source == "tiny":
        from workbench.models.tiny import tiny_model

        model = tiny_model(seed=seed, device=device, dtype=torch_dtype)
        info = {"weights_sha256": _tiny_weights_id(model), "cached": False}
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


def _tiny_weights_id(model) -> str:
    digest = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
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
    """Dequantize a GGUF once through transformers, then serve it from the safetensors cache."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = cache_dir("models", f"{spec.name}-{key}")
    cached = _read_cache(folder)
    if cached is not None:
        return cached, {"weights_sha256": json.loads((folder / "meta.json").read_text())["weights_sha256"],
                        "cached": True}

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("dequantizing %s (first load; cached afterwards in %s)", gguf, folder)
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (ValueError, OSError, KeyError) as exc:
        raise WorkbenchError(f"could not read {gguf} as a GGUF model ({exc}); is it a complete, supported file?") from exc
    model = _convert(spec, hf_model, tokenizer)
    sha = file_sha256(gguf)
    _write_cache(folder, model, {"weights_sha256": sha, "gguf": str(gguf), "spec": spec.name})
    del hf_model
    return model, {"weights_sha256": sha, "cached": False}


def _write_cache(folder: Path, model, meta: dict) -> None:
    """Write the converted model atomically: a half-written cache is never read."""
    import torch
    from safetensors.torch import save_file

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / "model.safetensors"))
    cfg = {k: v for k, v in model.cfg.to_dict().items() if k not in ("device", "dtype", "n_params")}
    (tmp / "config.json").write_text(json.dumps(cfg, default=str, indent=1))
    model.tokenizer.save_pretrained(tmp / "tokenizer")
    (tmp / "meta.json").write_text(json.dumps({"format": _CACHE_FORMAT, **meta}, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def _read_cache(folder: Path):
    meta_file = folder / "meta.json"
    if not meta_file.exists():
        return None
    try:
        if json.loads(meta_file.read_text()).get("format") != _CACHE_FORMAT:
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
        return model
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
    local_only = bool(spec.path) or not _hub_reachable()
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


def _hub_reachable(timeout: float = 3.0) -> bool:
    """False when offline mode is set or the hub's host does not answer."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
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
    digest = hashlib.sha256(config.to_json_string().encode()).hexdigest()[:16]
    folder = cache_dir("hf-configs", digest)
    config.save_pretrained(folder)
    return folder


def _portable_tokenizer(tokenizer):
    """Re-home a tokenizer in a plain folder so TransformerLens can re-load it offline (it does, for BOS)."""
    from transformers import AutoTokenizer

    name = getattr(tokenizer, "name_or_path", "") or ""
    if name and Path(name).is_dir() and not tokenizer.init_kwargs.get("gguf_file"):
        return tokenizer
    digest = hashlib.sha256(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode()).hexdigest()[:16]
    folder = cache_dir("tokenizers", digest)
    if not (folder / "tokenizer_config.json").exists():
        tokenizer.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


# --------------------------------------------------------------------- chat


def has_chat_template(model) -> bool:
    return getattr(model.tokenizer, "chat_template", None) is not None


def format_chat(model, user: str, system: str | None = None, history: list[dict] | None = None) -> str:
    """The prompt text for one user turn, through the model's own chat template (generation prompt added)."""
    if not has_chat_template(model):
        raise WorkbenchError(
            f"model {model.cfg.model_name!r} has no chat template: pass raw text instead (e.g. --no-chat)"
        )
    messages = ([{"role": "system", "content": system}] if system else []) + list(history or [])
    messages.append({"role": "user", "content": user})
    return model.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
