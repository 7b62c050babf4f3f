"""An HF model through nnsight, read at TransformerLens's site names: for models no local machine holds.

``load_nnsight`` wraps a Hugging Face model in nnsight's ``TransformersModel`` (locally, the weights read as
``load_model`` reads them; or, with ``remote=True``, a meta model whose forwards run on NDIF for users with
access) and presents what ``capture`` needs: a tokenizer, a ``cfg``, the provenance in ``workbench``, the
valid ``hook_dict`` and ``site_activations``. The sites map onto the HF modules as TransformerLens defines them:
``hook_resid_pre`` / ``hook_resid_post`` are a decoder layer's input and output, ``hook_attn_out`` and
``hook_mlp_out`` its attention and MLP outputs (only where no norm follows them inside the layer, as in Llama,
Mistral, Qwen; Gemma's post-norms make TransformerLens's attn_out differ, so those sites are not offered).
``ln_final.hook_normalized`` is not offered: TransformerLens takes it before the norm's scale, HF's module
after it. SmolLM2 through nnsight equals the hooked model at every offered site to float32 rounding (tested).
"""

from __future__ import annotations

from types import SimpleNamespace

from workbench.errors import WorkbenchError

KINDS = ("hook_resid_pre", "hook_attn_out", "hook_mlp_out", "hook_resid_post")  # in the order a layer runs them
LAYER_PATHS = ("model.layers", "model.language_model.layers", "transformer.h", "gpt_neox.layers")


def _get(root, path: str):
    for part in path.split("."):
        root = getattr(root, part, None)
        if root is None:
            return None
    return root


class NNsightModel:
    """What ``capture`` needs of a model, over an nnsight-wrapped HF model (see the module docstring)."""

    def __init__(self, lm, name: str, tokenizer, info: dict, device: str, dtype: str, remote: bool,
                 prepend_bos: bool | None):
        self.lm, self.tokenizer, self.remote = lm, tokenizer, remote
        hf = lm._module
        config = hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
        self._layers_path = next((p for p in LAYER_PATHS if _get(hf, p) is not None), None)
        if self._layers_path is None:
            raise WorkbenchError(f"{name}: nnsight capture knows decoder layers at {', '.join(LAYER_PATHS)}, and "
                                 f"this {type(hf).__name__} has none of them")
        layers = _get(hf, self._layers_path)
        self._parts = ("self_attn", "mlp") if hasattr(layers[0], "self_attn") else ("attn", "mlp")
        post_norms = hasattr(layers[0], "pre_feedforward_layernorm")  # Gemma: a norm after attention and MLP
        self.cfg = SimpleNamespace(
            model_name=name, n_layers=len(layers), d_model=int(config.hidden_size),
            n_ctx=int(getattr(config, "max_position_embeddings", 2048) or 2048), device=device,
            dtype=getattr(hf, "dtype", None), default_prepend_bos=True if prepend_bos is None else prepend_bos)
        kinds = ("hook_resid_pre", "hook_resid_post") if post_norms else KINDS
        self.hook_dict = {f"blocks.{i}.{k}": None for i in range(len(layers)) for k in kinds}
        self.workbench = {"name": name, "dtype": dtype, "attention": "nnsight" + ("-remote" if remote else ""),
                          "backend": "nnsight", "remote": remote, **info}

    def _envoy(self, site: str):
        _, layer, kind = site.split(".")
        block = _get(self.lm, self._layers_path)[int(layer)]
        if kind == "hook_resid_pre":
            return block.input
        if kind == "hook_resid_post":
            return block.output
        return getattr(block, self._parts[0] if kind == "hook_attn_out" else self._parts[1]).output

    def site_activations(self, tokens, sites: list[str]) -> dict:
        """{site: [batch, pos, ...]} of one forward of ``tokens`` (right-padded), stopped after the last site."""
        import torch

        def order(site: str):
            _, layer, kind = site.split(".")
            return (int(layer), KINDS.index(kind))

        inputs = {"input_ids": tokens, "attention_mask": torch.ones_like(tokens)}
        try:
            with self.lm.trace(inputs, remote=self.remote) as tracer:
                saved = dict().save()
                for site in sorted(sites, key=order):  # nnsight reads modules in the order the forward runs them
                    saved[site] = self._envoy(site)
                tracer.stop()
        except WorkbenchError:
            raise
        except Exception as exc:
            where = "on NDIF" if self.remote else "locally"
            raise WorkbenchError(f"the nnsight forward of {self.cfg.model_name} failed {where}: "
                                 f"{str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__}"
                                 ) from None
        return {site: (value[0] if isinstance(value, tuple) else value).detach() for site, value in saved.items()}


def load_nnsight(name: str | None = None, *, model_path=None, device: str = "auto", dtype="float32",
                 remote: bool = False, trust_remote_code: bool = False) -> NNsightModel:
    """A registry name, HF id, folder or ``.gguf`` through nnsight (``remote``: on NDIF; needs an NDIF API key)."""
    try:
        from nnsight import TransformersModel
    except ImportError:
        raise WorkbenchError("the nnsight backend needs nnsight: pip install 'workbench[nnsight]'") from None
    from workbench.models.loading import _torch_dtype, hf_parts, pick_device
    from workbench.models.registry import resolve

    spec = resolve(name, model_path)
    if remote:
        if spec.source != "hf":
            raise WorkbenchError(f"remote (NDIF) runs models by their Hugging Face id; {spec.name} is a "
                                 f"{spec.source} model: drop --remote")
        try:
            lm = TransformersModel(spec.hf_id, task="text-generation")
        except Exception as exc:
            raise WorkbenchError(f"nnsight could not set up {spec.hf_id} for NDIF ({type(exc).__name__}: "
                                 f"{str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}): it needs "
                                 "the model's config from the hub (online, or in the HF cache)") from None
        info = {"weights_sha256": f"remote:{spec.hf_id}", "source": "remote"}
        return NNsightModel(lm, spec.name, lm.tokenizer, info, "cpu", str(dtype), True, spec.prepend_bos)
    device = pick_device(device)
    torch_dtype = _torch_dtype(dtype, device)
    hf, tokenizer, info = hf_parts(spec, trust_remote_code, torch_dtype)
    lm = TransformersModel(hf.to(device), tokenizer=tokenizer, task="text-generation")
    return NNsightModel(lm, spec.name, tokenizer, {**info, "source": spec.source}, device,
                        str(torch_dtype).removeprefix("torch."), False, spec.prepend_bos)
