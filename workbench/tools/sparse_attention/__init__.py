"""Sparse attention for decoding: which cached tokens each KV head reads, as hooks on a KV-cached model.

One concept per module: ``selectors`` (the methods, each a mask ``[batch, kv_heads, keys]`` per
decode step), ``hooks`` (a selector applied to the model's attention scores, with its per-layer
metrics), ``evaluate`` (teacher-forced decoding under each method against full attention) and
``figures``. The plain-tensor kernels whose speed is measured live in ``workbench.kernels.attention``.
Every public name is re-exported here, so ``from workbench.tools.sparse_attention import X`` works.
"""

from workbench.kernels.attention import (
    ClusteredCache,
    TailFit,
    cluster_cache,
    decode_attention,
    kmeans,
    tactic_decode_attention,
    tactic_select,
)
from workbench.tools.sparse_attention.evaluate import (
    MASS_METHODS,
    compare_attention,
    decode,
    parse_method,
    parse_methods,
    prefill,
)
from workbench.tools.sparse_attention.figures import attention_figure
from workbench.tools.sparse_attention.hooks import (
    StepMetrics,
    group_mass,
    layer_types,
    sparse_attention_hooks,
)
from workbench.tools.sparse_attention.selectors import (
    H2O,
    SELECTORS,
    Full,
    Quest,
    Selector,
    StreamingLLM,
    Tactic,
    TopK,
    TopP,
    check_p,
    check_positive,
    group_union,
    make_selector,
    top_p_mask,
)

__all__ = [
    "H2O", "MASS_METHODS", "SELECTORS", "ClusteredCache", "Full", "Quest", "Selector", "StepMetrics",
    "StreamingLLM", "Tactic", "TailFit", "TopK", "TopP", "attention_figure", "check_p", "check_positive",
    "cluster_cache", "compare_attention", "decode", "decode_attention", "group_mass", "group_union", "kmeans",
    "layer_types", "make_selector", "parse_method", "parse_methods", "prefill", "sparse_attention_hooks",
    "tactic_decode_attention", "tactic_select", "top_p_mask",
]
