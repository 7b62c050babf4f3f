"""Load any model as a TransformerLens ``HookedTransformer``, offline first.

Weights are loaded without TransformerLens's reparametrisations (no LayerNorm
folding, no weight centering): activations at ``blocks.{L}.hook_resid_post`` are
the model's own hidden states, so what topology or an SAE finds is about the
model, not about a rewrite of it. GGUF sources are dequantized once and cached
as safetensors in the user cache, so the second load skips the slow part.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.io import build_once
from workbench.models.registry import ModelSpec, embedded_gguf, resolve
from workbench.paths import cache_dir, model_folder_name

log = logging.getLogger(__name__)

_CACHE_FORMAT = 1


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
    return {"model": info.get("name", model.cfg.model_name), "weights_sha256": _weights_sha256(model, info),
            "model_dtype": info.get("dtype", str(model.cfg.dtype).removeprefix("torch.")),
            "d_model": int(model.cfg.d_model), "attention": info.get("attention") or implementation(model, hook_names)}


def weights_stamp(model) -> tuple:
    """Where each parameter lives and how often it was edited in place (its storage and version counter): a cheap
    check that the weights are still those ``model.workbench["weights_sha256"]`` names. An edit through ``.data``,
    which PyTorch does not version, is not seen."""
    return tuple((name, p.data_ptr(), p._version) for name, p in model.named_parameters())


def stamp_weights(model) -> None:
    """Record the weights as those the model's recorded hash names (at load, or after restoring them exactly)."""
    model.__dict__["_workbench_weights_stamp"] = weights_stamp(model)


def edited_in_place(model) -> bool:
    """Whether a parameter was edited, replaced or moved since ``stamp_weights`` (a notebook's ablation, a
    fine-tune in place, weights quantized in a ``quant.quantized_weights`` block)."""
    loaded = model.__dict__.get("_workbench_weights_stamp")
    return loaded is not None and loaded != weights_stamp(model)


def _weights_sha256(model, info: dict) -> str | None:
    """The recorded hash while the weights are as loaded (or never stamped: a model ``load_model`` did not build);
    else the edited weights' own (``state_sha256``), computed once per edit."""
    sha, loaded = info.get("weights_sha256"), model.__dict__.get("_workbench_weights_stamp")
    if not sha or loaded is None:
        return sha
    now = weights_stamp(model)
    if now == loaded:
        return sha
    held = model.__dict__.get("_workbench_edited_sha256")
    if held is None or held[0] != now:
        held = model.__dict__["_workbench_edited_sha256"] = (now, "edited-" + state_sha256(model))
    return held[1]


def cache_identity(model, hook_names=()) -> dict:
    """``model_identity`` for the key of a cache entry: a model built in code records no weights hash, so its
    parameters are hashed (``state_sha256``), and two such models never share an entry."""
    identity = model_identity(model, hook_names)
    if not identity["weights_sha256"]:
        identity["weights_sha256"] = state_sha256(model)
    return identity


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
        info = {"weights_sha256": state_sha256(model), "cached": False, "seed": seed}  # one hash in every dtype
    elif spec.source == "derived":
        model = load_model(spec.base, device="cpu", dtype="float32", trust_remote_code=trust_remote_code, seed=seed)
        info = _apply_derived(model, spec)
    elif spec.source in ("embedded", "gguf"):
        gguf = embedded_gguf(spec) if spec.source == "embedded" else Path(spec.path)
        model, info = _load_gguf(spec, gguf, torch_dtype)
    else:
        model, info = _load_hf(spec, trust_remote_code, torch_dtype)
    model = _place(model, device, torch_dtype, what=f"{spec.name} in {str(torch_dtype).removeprefix('torch.')}")
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
    stamp_weights(model)  # caches trust the recorded hash only while the weights stay as loaded
    log.info("loaded %s in %.1fs (%s)", spec.name, model.workbench["load_seconds"], info)
    return model


def stable_rotary(model):
    """Recompute every attention layer's rotary tables in float64, then round them to their own dtype.

    TransformerLens computes them in float32 with vectorized sin/cos, whose results differ by an ulp between the
    SIMD body and the scalar tail of a loop, and where that boundary falls depends on the buffer's alignment in
    memory: the same model built in two processes had different ``blocks.0.attn.rotary_sin`` (seen in the tests,
    about 2 runs in 5). Rounded from float64 they are the same everywhere, so a capture gives the same bits in
    every process (a Ray worker's replica included). Every hooked model the workbench builds goes through here
    (``hooked_from_tensors``, ``tiny.tiny_model``).
    """
    import torch

    for block in getattr(model, "blocks", []):
        attn = getattr(block, "attn", None)
        if attn is None or not hasattr(attn, "rotary_sin") or not hasattr(attn, "calculate_sin_cos_rotary"):
            continue
        sin, cos = attn.calculate_sin_cos_rotary(model.cfg.rotary_dim, attn.rotary_sin.shape[0],
                                                 base=attn._rotary_base(), dtype=torch.float64)
        # through float32 as TransformerLens's tables are: a bfloat16 model holds what a float32 one cast to it holds
        attn.rotary_sin = sin.float().to(attn.rotary_sin.device, attn.rotary_sin.dtype)
        attn.rotary_cos = cos.float().to(attn.rotary_cos.device, attn.rotary_cos.dtype)
    return model


def model_source(model) -> dict:
    """Where ``model`` came from, as plain values (name, path, device, dtype, seed, weights hash): enough to load it
    again in another process (a Ray worker's replica) or in another dtype (``load_source``)."""
    info = getattr(model, "workbench", None) or {}
    if not info.get("name") or not info.get("weights_sha256"):
        raise WorkbenchError("this model cannot be loaded again by name: load it with workbench.models.load_model")
    return {"name": info["name"], "model_path": info["path"] if info.get("source") in ("local", "gguf") else None,
            "device": str(model.cfg.device), "dtype": info.get("dtype", "float32"), "seed": info.get("seed", 0),
            "weights_sha256": info["weights_sha256"]}


def load_source(source: dict, **overrides):
    """The model ``model_source`` describes, with ``overrides`` (e.g. another ``dtype``); refused if the weights read
    are not the ones described (the files changed since)."""
    settings = {k: source[k] for k in ("model_path", "device", "dtype", "seed")} | overrides
    model = load_model(source["name"], **settings)
    if model.workbench.get("weights_sha256") != source["weights_sha256"]:
        raise WorkbenchError(f"{source['name']} loaded again has other weights ({model.workbench.get('weights_sha256')}"
                             f" vs {source['weights_sha256']}): its files changed since it was first loaded")
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


def _place(model, device, torch_dtype, what: str = "the model"):
    """``model`` in ``torch_dtype`` on ``device``; on CUDA split over as many GPUs as it needs (``placement``).

    ``cuda`` may spread the model over every GPU from the first; ``cuda:N`` holds it on GPU N alone. A model
    that fits nowhere is refused in one line before anything moves.
    """
    if model.cfg.dtype != torch_dtype:  # cast before moving: the GPU never holds two copies
        model = model.to(torch_dtype, print_details=False)
    if device.startswith("cuda"):
        from workbench.models.placement import devices_needed, free_gpu_bytes, module_bytes, place

        first = int(device.partition(":")[2] or 0)
        free = free_gpu_bytes(first)
        pinned = ":" in device
        try:
            n = devices_needed(module_bytes(model), free[:1] if pinned else free, what=what)
        except WorkbenchError as exc:
            if pinned and len(free) > 1:
                raise WorkbenchError(f"{exc}; or --device cuda to spread it over the {len(free)} GPUs from "
                                     f"{device}") from None
            raise
        if n > 1:
            log.info("%s is split over %d GPUs (cuda:%d-%d)", what, n, first, first + n - 1)
            return place(model, n, first)
    if str(model.cfg.device) != device:
        model = model.to(device, print_details=False)
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


def _load_gguf(spec: ModelSpec, gguf: Path, dtype):
    """Dequantize a GGUF once through transformers into the safetensors cache, then load from the cache, straight
    into ``dtype`` (the first load too, so it gives what every later one gives).

    Two first loads at once are safe: one dequantizes and publishes the entry, the other waits and reads it.
    """
    _check_gguf(gguf)
    folder = gguf_cache_folder(spec, gguf)
    loaded: dict = {}

    def ready(entry: Path) -> bool:
        loaded["cached"] = _read_cache(entry, dtype)
        return loaded["cached"] is not None

    def build(tmp: Path) -> None:
        log.info("dequantizing %s (first load; cached afterwards in %s)", gguf, folder)
        _write_cache(tmp, _dequantize(spec), {"weights_sha256": file_sha256(gguf), "gguf": str(gguf),
                                                    "spec": spec.name})
        loaded["built"] = True

    build_once(folder, build, ready, f"the model cache {folder}")
    if not loaded.get("built"):
        return loaded["cached"]
    fresh = _read_cache(folder, dtype)
    if fresh is None:
        raise WorkbenchError(f"the model cache {folder} was written but cannot be read back: remove it and retry")
    model, info = fresh
    return model, {**info, "cached": False}


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


def _dequantize(spec: ModelSpec):
    """The GGUF's model as a float32 ``HookedTransformer`` (transformers dequantizes it, TransformerLens converts)."""
    import torch

    hf_model, tokenizer, _ = hf_parts(spec, False, torch.float32)
    holder = [hf_model]
    del hf_model
    return _convert(spec, holder, tokenizer, torch.float32)


def _write_cache(folder: Path, model, meta: dict) -> None:
    """Write the converted model's parameters (float32) into ``folder`` (a fresh temporary one that ``build_once``
    publishes). Buffers (causal masks, rotary tables) are left out: a load builds them from the config."""
    import torch
    from safetensors.torch import save_file

    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.named_parameters()}
    save_file(state, str(folder / "model.safetensors"))
    cfg = {k: v for k, v in model.cfg.to_dict().items() if k not in ("device", "dtype", "n_params")}
    (folder / "config.json").write_text(json.dumps(cfg, default=str, indent=1))
    model.tokenizer.save_pretrained(folder / "tokenizer")
    (folder / "meta.json").write_text(json.dumps({"format": _CACHE_FORMAT, **meta}, indent=1))


def _read_cache(folder: Path, dtype=None):
    """(model, info) from a published cache entry, its weights read straight into ``dtype`` (default float32);
    None when there is none or it is stale or damaged."""
    meta_file = folder / "meta.json"
    if not meta_file.exists():
        return None
    try:
        meta = json.loads(meta_file.read_text())
        if meta.get("format") != _CACHE_FORMAT:
            return None
        import torch
        from transformer_lens import HookedTransformerConfig
        from transformers import AutoTokenizer

        from workbench.models.checkpoint import Checkpoint

        cfg_dict = json.loads((folder / "config.json").read_text())
        cfg = HookedTransformerConfig.from_dict({**cfg_dict, "dtype": torch.float32, "device": "cpu"})
        tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
        checkpoint = Checkpoint([folder / "model.safetensors"])
        model = hooked_from_tensors(cfg, tokenizer, checkpoint.keys(), checkpoint.read, dtype or torch.float32)
        return model, {"weights_sha256": meta["weights_sha256"], "cached": True}
    except Exception as exc:  # a stale or damaged cache is rebuilt, never fatal
        log.warning("model cache %s unreadable (%s); rebuilding it", folder, exc)
        return None


@contextlib.contextmanager
def parameters_on_meta():
    """Modules built inside (by this thread) get their parameters on the meta device: no memory and no
    initialisation, since the weights are assigned from a checkpoint next. Buffers (masks, rotary tables) are
    built as usual."""
    import torch

    register, owner = torch.nn.Module.register_parameter, threading.get_ident()

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and not param.is_meta and threading.get_ident() == owner:  # a tied one stays itself
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def hooked_from_tensors(cfg, tokenizer, names, read, dtype):
    """A ``HookedTransformer`` whose parameters are ``read(name, dtype)`` for each of ``names``, assigned one at a
    time into a model built without weights: the model is never held twice, so a load needs about the weights'
    bytes in ``dtype`` plus one tensor. Buffers in ``names`` are skipped (the config builds them); a bias the
    checkpoint lacks is zero, as TransformerLens fills it; any other missing parameter is refused."""
    import torch
    from transformer_lens import HookedTransformer

    cfg.dtype = dtype  # rotary tables are computed in float32 and cast, as a float32 model cast afterwards has them
    with parameters_on_meta():
        model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    # the other float buffers too (still no weights to cast), through nn.Module's own ``to``: TransformerLens's
    # dtype branch rebuilds the whole state dict twice per entry to no effect (2.6 s of a SmolLM2 load)
    model.cfg.dtype = dtype
    torch.nn.Module.to(model, dtype)
    params = dict(model.named_parameters())
    buffers = {name for name, _ in model.named_buffers()}
    for name in names:
        if name in buffers:
            continue
        if name not in params:
            raise WorkbenchError(f"the checkpoint holds {name}, which this model has no parameter for")
        _assign(model, name, read(name, dtype), params[name])
    for name, param in model.named_parameters():
        if param.is_meta:
            if not name.split(".")[-1].startswith("b"):
                raise WorkbenchError(f"the checkpoint has no {name}: it does not fit this model's config")
            _assign(model, name, torch.zeros(param.shape, dtype=dtype), param)
    return stable_rotary(model)


def _assign(model, name: str, tensor, old) -> None:
    if tuple(tensor.shape) != tuple(old.shape):
        raise WorkbenchError(f"the checkpoint's {name} has shape {list(tensor.shape)}, the model's "
                             f"{list(old.shape)}: it does not fit this model's config")
    _set_parameter(model, name, tensor.contiguous(), old.requires_grad)


def _set_parameter(model, name: str, tensor, requires_grad: bool) -> None:
    """Replace parameter ``name`` (dotted) of ``model`` by ``tensor``, without copying it."""
    import torch

    owner_name, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    owner._parameters[attr] = torch.nn.Parameter(tensor, requires_grad=requires_grad)


# ----------------------------------------------------------------------- HF


def _load_hf(spec: ModelSpec, trust_remote_code: bool, dtype):
    """An HF model (hub id or local folder) straight into ``dtype``: its safetensors are read tensor by tensor into
    a model built without weights (``hf_from_checkpoint``), then converted into the hooked model one tensor at a
    time, so about the weights' bytes in ``dtype`` are held, not two or three copies (``bench_load_memory``)."""
    hf_model, tokenizer, info = hf_parts(spec, trust_remote_code, dtype)
    holder = [hf_model]
    del hf_model
    return _convert(spec, holder, tokenizer, dtype), info


def hf_parts(spec: ModelSpec, trust_remote_code: bool, dtype):
    """(HF model in ``dtype``, tokenizer, {weights_sha256, cached}) of a registry spec, read the way
    ``load_model`` reads it (GGUF through transformers' reader; safetensors without a second copy)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if spec.source in ("embedded", "gguf"):
        gguf = embedded_gguf(spec) if spec.source == "embedded" else Path(spec.path)
        _check_gguf(gguf)
        try:
            hf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        except Exception as exc:  # a truncated or unsupported file fails deep in the reader, with many types
            reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise WorkbenchError(f"could not read {gguf} as a GGUF model ({reason}); is it a complete, supported "
                                 "file?") from None
        return hf_model.to(dtype).eval(), tokenizer, {"weights_sha256": file_sha256(gguf), "cached": False}
    if spec.source not in ("hf", "local"):
        raise WorkbenchError(f"{spec.name} is a {spec.source} model, which has no Hugging Face form: load it with "
                             "load_model")

    where = spec.path or spec.hf_id
    # The local cache first; the hub only when it answers, so an offline machine fails in a second, not
    # after minutes of retries.
    local_only = bool(spec.path) or not hub_reachable()
    options = dict(trust_remote_code=trust_remote_code, local_files_only=local_only)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **options)
        config = AutoConfig.from_pretrained(where, **options)
        hf_model = hf_from_checkpoint(config, _checkpoint_folder(spec, local_only), dtype, trust_remote_code)
        if hf_model is None:  # no safetensors, or names this reader does not map: transformers' own loader
            hf_model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **options)
    except WorkbenchError:
        raise
    except Exception as exc:  # hub clients raise many types; the user needs one line either way
        raise WorkbenchError(_missing_weights_message(spec, exc, local_only)) from None
    revision = getattr(hf_model.config, "_commit_hash", None)
    return hf_model, tokenizer, {"weights_sha256": revision or "unknown", "cached": False}


def _checkpoint_folder(spec: ModelSpec, local_only: bool) -> Path | None:
    """The folder holding a model's safetensors: its path, or its snapshot in the Hugging Face cache (fetched
    when the hub answers); None when there is none."""
    if spec.path:
        return Path(spec.path) if Path(spec.path).is_dir() else None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec.hf_id, local_files_only=local_only,
                                      allow_patterns=["*.safetensors", "*.json"]))
    except Exception as exc:  # not cached / not on the hub: transformers' loader gives the user's error
        log.info("no safetensors snapshot of %s (%s): transformers loads it", spec.hf_id, exc)
        return None


def hf_from_checkpoint(config, folder: Path | None, dtype, trust_remote_code: bool = False):
    """The HF model of ``config`` with its weights read from the safetensors in ``folder`` (``checkpoint.Checkpoint``:
    no memory map, each tensor read straight into ``dtype``); None when the folder has no safetensors or its
    names are not the model's parameter names (transformers then loads it its own way)."""
    from transformers import AutoModelForCausalLM

    from workbench.models.checkpoint import Checkpoint

    checkpoint = Checkpoint.from_folder(folder) if folder is not None else None
    if checkpoint is None:
        return None
    with parameters_on_meta():  # buffers (rotary frequencies) built as usual: the model runs as well as converts
        hf_model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    params = dict(hf_model.named_parameters())  # a tied weight appears once, under its first name
    tied = {name for name, p in hf_model.named_parameters(remove_duplicate=False) if name not in params}
    check_host_memory(sum(p.numel() * p.element_size() for p in params.values()),
                      f"{getattr(config, 'name_or_path', '') or folder.name} in {str(dtype).removeprefix('torch.')}")
    if any(name not in checkpoint.where for name in params) or any(
            checkpoint.shape(name) != tuple(p.shape) for name, p in params.items()):
        log.info("the checkpoint in %s does not name this model's parameters: transformers loads it", folder)
        return None
    for name in params:
        _set_parameter(hf_model, name, checkpoint.read(name, dtype), requires_grad=False)
    if tied:
        hf_model.tie_weights()
    hf_model.eval()
    return hf_model


def available_host_bytes(meminfo: str | Path = "/proc/meminfo") -> int | None:
    """Memory the kernel says a new process can take without swapping (``MemAvailable``); None where unknown."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_host_memory(need: int, what: str, meminfo: str | Path = "/proc/meminfo") -> None:
    """Refuse, before a byte is read, a load whose weights alone exceed the host's available memory."""
    available = available_host_bytes(meminfo)
    if available is not None and need > available:
        raise WorkbenchError(f"{what} needs {need / 1e9:.1f} GB of host memory to load and {available / 1e9:.1f} GB "
                             "are available: use --dtype bfloat16 (or float16), a machine with more memory, or the "
                             "nnsight backend with --remote")


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


def _convert(spec: ModelSpec, holder: list, tokenizer, dtype):
    """HF model → HookedTransformer in ``dtype``, through TransformerLens's own weight converters.

    ``holder`` holds the only reference to the HF model; it is dropped once converted, so each HF tensor is freed
    as soon as the hooked model's copy of it is in place, and the model is never held twice."""
    import torch
    from transformer_lens.loading_from_pretrained import (
        get_pretrained_model_config,
        get_pretrained_state_dict,
    )

    hf_model = holder.pop()
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
    del hf_model  # from here on only ``state`` holds the HF tensors (mostly as views), and it is emptied as we go
    model = hooked_from_tensors(cfg, _portable_tokenizer(tokenizer), list(state),
                                lambda name, to: state.pop(name).detach().to(to), dtype)
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
