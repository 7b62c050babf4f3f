"""Fused attention for passes that read no attention internals: the same math in less time.

TransformerLens computes attention as explicit scores, a ``torch.where`` causal mask, a softmax and a second
matmul, so that ``hook_attn_scores`` and ``hook_pattern`` can see them; on 2 CPU cores that is about half of a
SmolLM2 forward (stop 30's profile: masking, copies and softmax). A capture of residual streams never looks at
those tensors, so inside ``fused_attention`` each supported attention layer runs
``torch.nn.functional.scaled_dot_product_attention`` between TransformerLens's own q/k/v (with their hooks and
rotary embedding) and its own output projection (``hook_z`` still fires). A KV cache (decoding, a shared
prefix) is read the way TransformerLens reads it: cached keys first, every key rotated at its own position.
Padding masks become the kernel's mask. Everything TransformerLens does that the fused kernel does not (ALiBi,
soft-capping, attention sinks, ...) falls back to its own forward, as does any pass that hooks the scores, the
pattern or the per-head result, or computes gradients.
Results equal TransformerLens's up to floating-point rounding (tested in float32: within 1e-5 relative; in
bfloat16 both round differently, and the detectors' AUCs moved by at most 0.005). Hand-timed forwards on 2 cores
ran 1.2x (float32) to 1.4x (bfloat16) faster; bench_detect's scoring path showed no gain (0.99x) in one run.

The same passes run each gated MLP (LLaMA, Gemma, Qwen, ...) as one GEMM for gate and input together, the
activation and product in place, and the output GEMM, on weights laid out once (``_fused_mlp_forward``).
TransformerLens copies all three [d_model, d_mlp] weights into F.linear's layout on every call and adds a zero
``b_in`` over the whole [batch, pos, d_mlp] activation: 9% of a bfloat16 SmolLM2 forward on 8 x 230 tokens on
2 cores (1111 -> 1011 ms, hand-timed), with the same numbers bit for bit there in bfloat16 and float32. An MLP
whose ``hook_pre``, ``hook_pre_linear`` or ``hook_post`` has a hook, or a pass with gradients, runs
TransformerLens's forward.
"""

from __future__ import annotations

import contextlib
import os
import types

from workbench.errors import WorkbenchError

INTERNALS = ("hook_attn_scores", "hook_pattern", "hook_result")  # what the fused kernel never materialises
SWITCH = "WORKBENCH_FUSED_ATTENTION"  # "0" turns the fused path off (TransformerLens's attention everywhere)


def env_switch(name: str, on: str, off: str) -> bool:
    """Whether the environment switch ``name`` is on (unset means on); anything but 1/0 (true/false, on/off) is
    refused in one line that says what each value does."""
    value = os.environ.get(name, "1").strip().lower()
    if value not in ("0", "1", "false", "true", "off", "on", ""):
        raise WorkbenchError(f"{name}={value!r}: use 1 ({on}) or 0 ({off})")
    return value not in ("0", "false", "off")


def enabled() -> bool:
    return env_switch(SWITCH, "fused attention where it is exact", "TransformerLens's")


def supported(attn) -> bool:
    """Whether this attention layer's forward is exactly causal softmax attention over its q/k/v."""
    cfg = attn.cfg
    softcap = getattr(cfg, "attn_scores_soft_cap", -1.0)
    return (cfg.positional_embedding_type in ("standard", "rotary", "shortformer")
            and (getattr(attn, "_attention_dir_override", None) or cfg.attention_dir) == "causal"
            and not (softcap is not None and softcap > 0)
            and not getattr(cfg, "use_logn_attn", False) and not getattr(cfg, "use_attention_sinks", False)
            and not getattr(cfg, "load_in_4bit", False) and not cfg.use_attn_result
            and getattr(cfg, "clip_qkv", None) is None
            and cfg.original_architecture not in ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")
            and (attn.attn_type != "local" or isinstance(cfg.window_size, int)))


def _fused_forward(self, query_input, key_input, value_input, past_kv_cache_entry=None,
                   additive_attention_mask=None, attention_mask=None, position_bias=None):
    import torch
    import torch.nn.functional as F

    offset = 0 if past_kv_cache_entry is None else past_kv_cache_entry.past_keys.size(1)  # cached keys come first
    n = query_input.shape[1]
    padded = attention_mask is not None and not bool(attention_mask.all())  # all ones: a left-padding tokenizer's
    # mask of a right-padded batch, or cached prefixes all of whose keys count
    if padded and not offset and bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all()):
        padded = False  # right padding: causality alone keeps every real query off the pads after it, and the
        # kernel skips the blocks above the diagonal (real rows bit-identical to the masked call; pads are never read)
    mask = None
    if offset or padded or (self.attn_type == "local" and n > self.cfg.window_size):
        mask = self._make_causal_mask(query_ctx_length=n, key_ctx_length=offset + n, past_kv_pos_offset=offset,
                                      device=query_input.device)
        if padded:  # a pad sees only itself (so no row is empty); nothing real ever sees a pad
            own = torch.arange(n, device=mask.device)[:, None] + offset == torch.arange(offset + n, device=mask.device)
            mask = (mask & attention_mask.to(mask.device).bool()[:, None, None, :]) | own
    if additive_attention_mask is not None or position_bias is not None or torch.is_grad_enabled():
        return type(self).forward(self, query_input, key_input, value_input, past_kv_cache_entry,
                                  additive_attention_mask, attention_mask, position_bias)
    q, k, v = _qkv(self, query_input, key_input, value_input)  # hook_q/k/v, qk-norm
    if past_kv_cache_entry is not None:
        k, v = past_kv_cache_entry.append(k, v)
    if self.cfg.positional_embedding_type == "rotary":  # every key at its own position (a padded one's is masked)
        q = self.hook_rot_q(self.apply_rotary(q, offset, attention_mask))
        k = self.hook_rot_k(self.apply_rotary(k, 0, attention_mask))
    z = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.to(q.dtype).transpose(1, 2),
                                       attn_mask=mask, is_causal=mask is None,
                                       scale=1.0 / float(self.attn_scale),
                                       enable_gqa=k.shape[2] != q.shape[2]).transpose(1, 2)
    z = self.hook_z(z)  # [batch, pos, head_index, d_head], as TransformerLens's calculate_z_scores gives it
    w = self.W_O.reshape(-1, self.W_O.shape[-1]).T  # [d_model, head_index * d_head]
    return F.linear(z.reshape(z.shape[0], n, -1).to(w.dtype), w, self.b_O)


def _qkv(self, query_input, key_input, value_input):
    """TransformerLens's ``calculate_qkv_matrices`` (hooks, grouped keys, qk-norm) on weights laid out once: it
    rearranges each [head, d_model, d_head] weight on every call, a copy F.linear makes again each time (4% of a
    capture's forward on 2 cores). The same GEMM on the same values, so the same numbers; anything it does
    differently (split or 4-bit inputs, another device) goes through its own method."""
    import torch.nn.functional as F

    cfg = self.cfg
    if cfg.use_split_qkv_input or cfg.use_attn_in or getattr(cfg, "load_in_4bit", False) \
            or query_input.device != self.W_Q.device:
        return self.calculate_qkv_matrices(query_input, key_input, value_input)
    grouped = hasattr(self, "_W_K") and not getattr(cfg, "ungroup_grouped_query_attention", False)
    out = []
    for x, w, b, hook in ((query_input, "W_Q", "b_Q", self.hook_q),
                          (key_input, "_W_K" if grouped else "W_K", "_b_K" if grouped else "b_K", self.hook_k),
                          (value_input, "_W_V" if grouped else "W_V", "_b_V" if grouped else "b_V", self.hook_v)):
        bias = getattr(self, b)
        y = F.linear(x, _flat_weight(self, w), bias.reshape(-1))
        out.append(hook(y.reshape(x.shape[0], x.shape[1], bias.shape[0], bias.shape[1])))
    q, k, v = out
    if cfg.use_qk_norm:
        q = self._apply_qk_norm(q, self.q_norm)
        k = self._apply_qk_norm(k, self.k_norm)
    return q, k, v


def _flat_weight(attn, name: str):
    """``attn.<name>`` ([head, d_model, d_head]) as the contiguous [(head d_head), d_model] matrix F.linear reads,
    kept on the module and rebuilt whenever the parameter is replaced or edited in place (its storage or version
    counter changes: quantization and the backdoor's weight edits ``copy_`` into it; an edit through ``.data``,
    which PyTorch does not version, is not seen)."""
    w = getattr(attn, name)
    key = _layout_key(w)
    held = attn.__dict__.setdefault("_flat_weights", {})
    if name not in held or held[name][0] != key:
        held[name] = (key, w.detach().permute(0, 2, 1).reshape(-1, w.shape[1]).contiguous())
    return held[name][1]


def _layout_key(w) -> tuple:
    """What a weight laid out once from ``w`` depends on: its storage, its version counter (bumped by in-place
    edits such as ``copy_``), dtype, device and shape."""
    return (w.data_ptr(), w._version, w.dtype, w.device, tuple(w.shape))


def _fused_mlp_forward(self, x):
    """TransformerLens's ``GatedMLP.forward`` on weights laid out once (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    if torch.is_grad_enabled() or x.device != self.W_gate.device or any(
            hook._forward_hooks or hook._forward_pre_hooks
            for hook in (self.hook_pre, self.hook_pre_linear, self.hook_post)):
        return type(self).forward(self, x)
    key = tuple(_layout_key(w) for w in (self.W_gate, self.W_in, self.W_out, self.b_in))
    held = self.__dict__.get("_fused_weights")
    if held is None or held[0] != key:  # rebuilt whenever a weight is replaced or edited in place
        gate_in = torch.cat([self.W_gate.detach().T, self.W_in.detach().T]).contiguous()  # [2 d_mlp, d_model]
        held = (key, gate_in, self.W_out.detach().T.contiguous(), bool(self.b_in.detach().any()))
        self.__dict__["_fused_weights"] = held
    _, gate_in, out, has_b_in = held
    d_mlp = self.W_gate.shape[1]
    both = F.linear(x, gate_in)
    post = self.act_fn(both[..., :d_mlp]).mul_(both[..., d_mlp:])
    if has_b_in:  # TransformerLens adds b_in after the product; adding zeros changes nothing
        post += self.b_in
    return F.linear(post, out, self.b_out)


def _fused_mlps(model) -> list:
    from transformer_lens.components import GatedMLP

    return [block.mlp for block in getattr(model, "blocks", []) if type(getattr(block, "mlp", None)) is GatedMLP
            and not (model.cfg.is_layer_norm_activation() and getattr(block.mlp, "ln", None) is not None)]


def _fused_layers(model, hook_names) -> list:
    names = list(hook_names)
    if not enabled() or any(not isinstance(h, str) or h.rsplit(".", 1)[-1] in INTERNALS for h in names):
        return []
    return [block.attn for block in getattr(model, "blocks", []) if hasattr(block, "attn") and supported(block.attn)]


def implementation(model, hook_names=()) -> str:
    """Which attention a no-grad pass of ``model`` with ``hook_names`` runs: what caches of its outputs record."""
    return "fused" if _fused_layers(model, hook_names) else "transformer_lens"


@contextlib.contextmanager
def fused_attention(model, hook_names=()):
    """Within the block, the supported attention layers and the gated MLPs of ``model`` run fused (see the module
    docstring); ``hook_names``: the hooks the pass will use (any of ``INTERNALS``, or a non-name filter, keeps
    TransformerLens's attention everywhere; an MLP checks its own hooks when it runs)."""
    layers = _fused_layers(model, hook_names)
    mlps = _fused_mlps(model) if enabled() else []
    for attn in layers:
        attn.forward = types.MethodType(_fused_forward, attn)
    for mlp in mlps:
        mlp.forward = types.MethodType(_fused_mlp_forward, mlp)
    try:
        yield len(layers)
    finally:
        for module in layers + mlps:
            module.__dict__.pop("forward", None)
