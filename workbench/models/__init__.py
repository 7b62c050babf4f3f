"""Model registry and loading: any name, HF id, folder or GGUF → a TransformerLens ``HookedTransformer``."""

from workbench.models.loading import (
           ChatPrompt,
           chat_record,
           chat_records,
           format_chat,
           has_chat_template,
           load_model,
           model_identity,
           pick_device,
)
from workbench.models.registry import DEFAULT_MODEL, REGISTRY, ModelSpec, resolve

__all__ = ["DEFAULT_MODEL", "REGISTRY", "ChatPrompt", "ModelSpec", "chat_record", "chat_records", "format_chat", "has_chat_template",
           "load_model", "model_identity", "pick_device", "resolve"]
