"""A tiny random Llama-style model with a byte-level tokenizer, for fast tests.

Same architecture family as the embedded default (RMS norm, rotary, gated MLP,
grouped-query attention) so tests exercise the code paths real models take,
and a real ``PreTrainedTokenizerFast`` (offsets, padding, a chat template) built
offline. Deterministic by seed.
"""

from __future__ import annotations

TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges: 256 byte tokens plus <bos>, <eos>, <pad>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for special in ("<bos>", "<eos>", "<pad>"):
        vocab[special] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", add_bos_token=True
    )
    # TransformerLens re-loads a tokenizer by name unless it already adds BOS; it has no name here.
    fast.init_kwargs["name_or_path"] = "tiny"
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def tiny_config(seed: int = 0, n_layers: int = 4, d_model: int = 64, n_ctx: int = 512, dtype=None):
    """The ``HookedTransformerConfig`` of the tiny model."""
    import torch
    from transformer_lens import HookedTransformerConfig

    return HookedTransformerConfig(
        model_name="tiny",
        n_layers=n_layers,
        d_model=d_model,
        d_head=16,
        n_heads=d_model // 16,
        n_key_value_heads=max(1, d_model // 32),
        d_mlp=4 * d_model,
        d_vocab=259,
        n_ctx=n_ctx,
        act_fn="silu",
        gated_mlp=True,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=16,
        rotary_base=10000,
        final_rms=True,
        default_prepend_bos=True,
        tokenizer_prepends_bos=False,
        original_architecture="LlamaForCausalLM",
        seed=seed,
        dtype=dtype or torch.float32,
    )


def tiny_model(seed: int = 0, device: str = "cpu", dtype=None, **config):
    """Random weights (``initializer_range`` scaled init), deterministic by ``seed``."""
    from transformer_lens import HookedTransformer

    from workbench.models.loading import stable_rotary

    cfg = tiny_config(seed=seed, dtype=dtype, **config)
    model = HookedTransformer(cfg, tokenizer=byte_tokenizer(), move_to_device=False)
    return stable_rotary(model).to(device, print_details=False).eval()
