"""Model registry and loading: any name, HF id, folder or GGUF → a TransformerLens ``HookedTransformer``."""

from workbench.models.loading import format_chat, has_chat_template, load_model, pick_device
from workbench.models.registry import DEFAULT_MODEL, REGISTRY, ModelSpec, resolve

__all__ = ["DEFAULT_MODEL", "REGISTRY", "ModelSpec", "format_chat", "has_chat_template", "load_model",
           "pick_device", "resolve"]
