"""Splitting a model over GPUs, checked without one: 8B- and 70B-shaped hooked models on the meta device."""

from __future__ import annotations

import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.models.placement import block_index, devices_needed, loads, module_bytes, placement

GB = 10**9
LLAMA3 = {"8b": dict(d_model=4096, d_mlp=14336, n_heads=32, n_kv=8, n_layers=32),
          "70b": dict(d_model=8192, d_mlp=28672, n_heads=64, n_kv=8, n_layers=80)}


def meta_llama(size: str):
    """A Llama-3-shaped HookedTransformer in bfloat16 with its parameters on the meta device (no memory)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from workbench.models.loading import parameters_on_meta

    s = LLAMA3[size]
    cfg = HookedTransformerConfig(
        n_layers=s["n_layers"], d_model=s["d_model"], d_head=128, n_heads=s["n_heads"], n_key_value_heads=s["n_kv"],
        d_mlp=s["d_mlp"], d_vocab=128256, n_ctx=256, act_fn="silu", gated_mlp=True, normalization_type="RMS",
        positional_embedding_type="rotary", rotary_dim=128, final_rms=True, original_architecture="LlamaForCausalLM",
        dtype=torch.bfloat16)
    with parameters_on_meta():
        model = HookedTransformer(cfg, move_to_device=False)
    return model.to(torch.bfloat16, print_details=False)


@pytest.fixture(scope="module")
def llama8b():
    return meta_llama("8b")


def test_the_bytes_are_the_weights_in_the_target_dtype(llama8b):
    sizes = module_bytes(llama8b)
    weights = sum(p.numel() for p in llama8b.parameters()) * 2
    total = sizes["embed"] + sum(sizes["blocks"]) + sizes["final"]
    assert 16.0 * GB < weights <= total < weights * 1.01  # Llama-3-8B: 8.03B parameters, buffers are small here
    assert sizes["embed"] == 128256 * 4096 * 2  # untied: the unembedding beside it, with its bias and the final norm
    assert sizes["final"] == sizes["embed"] + 128256 * 2 + 4096 * 2


@pytest.mark.parametrize("free_gb, expect", [([80], 1), ([24, 24], 1), ([10, 10, 10, 10], 2), ([6] * 8, 4)])
def test_the_fewest_gpus_that_hold_it(llama8b, free_gb, expect):
    sizes = module_bytes(llama8b)
    free = [g * GB for g in free_gb]
    n = devices_needed(sizes, free)
    assert n == expect
    assert all(load <= room * 0.85 for load, room in zip(loads(sizes, n), free, strict=False))
    if n > 1:  # one fewer would not fit
        assert any(load > room * 0.85 for load, room in zip(loads(sizes, n - 1), free, strict=False))


def test_a_model_that_fits_nowhere_is_one_line(llama8b):
    with pytest.raises(WorkbenchError, match=r"needs 16\.\d GB, and the 2 GPU\(s\) here have 8\.0 GB free.*--dtype"):
        devices_needed(module_bytes(llama8b), [4 * GB, 4 * GB], what="llama-8b in bfloat16")


def test_the_split_is_transformer_lens_s_and_covers_every_parameter(llama8b):
    from transformer_lens.utilities.multi_gpu import get_device_for_block_index

    cfg = llama8b.cfg
    plan = placement(llama8b, 3, first=1)
    for i in range(cfg.n_layers):  # the residual stream goes where TransformerLens sends it before block i
        cfg.n_devices, cfg.device = 3, "cuda:1"
        assert plan[f"blocks.{i}"] == str(get_device_for_block_index(i, cfg))
    cfg.n_devices, cfg.device = 1, "cpu"
    assert plan["embed"] == "cuda:1" and plan["unembed"] == plan["ln_final"] == plan[f"blocks.{cfg.n_layers - 1}"]
    assert set(plan.values()) == {"cuda:1", "cuda:2", "cuda:3"}
    for name, _ in [*llama8b.named_parameters(), *llama8b.named_buffers()]:
        assert any(name == m or name.startswith(m + ".") for m in plan), name


def test_70b_in_bfloat16_on_eight_80gb_gpus():
    model = meta_llama("70b")
    sizes = module_bytes(model)
    assert 140 * GB < sum(sizes["blocks"]) + sizes["embed"] + sizes["final"] < 142 * GB
    n = devices_needed(sizes, [80 * GB] * 8)
    assert n == 3 and max(loads(sizes, n)) <= 68 * GB
    assert [block_index(i, 80, 3) for i in (0, 26, 27, 53, 54, 79)] == [0, 0, 1, 1, 2, 2]


def test_a_pinned_gpu_too_small_suggests_spreading(llama8b, monkeypatch):
    from workbench.models import loading
    from workbench.models import placement as placement_module

    model = llama8b
    monkeypatch.setattr(placement_module, "free_gpu_bytes", lambda first=0: [8 * GB, 8 * GB, 8 * GB])
    with pytest.raises(WorkbenchError, match="--device cuda to spread it over the 3 GPUs from cuda:0"):
        loading._place(model, "cuda:0", torch.bfloat16, what="llama-8b in bfloat16")
    monkeypatch.setattr(placement_module, "free_gpu_bytes", lambda first=0: [4 * GB])
    with pytest.raises(WorkbenchError, match="needs 16.1 GB, and the 1 GPU"):
        loading._place(model, "cuda", torch.bfloat16, what="llama-8b in bfloat16")
