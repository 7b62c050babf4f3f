"""Fused attention (models.fused_attention) equals TransformerLens's attention, and steps aside when it must."""

import pytest
import torch

from workbench.capture import StopForward, forward_until_stopped
from workbench.errors import WorkbenchError
from workbench.models import load_model
from workbench.models.fused_attention import SWITCH, fused_attention, implementation


def _resid(model, tokens, site, fused: bool, extra=()):
    """``site``'s activations from a forward_until_stopped pass (fused unless ``fused`` is False)."""
    got = {}

    def read(act, hook):
        got["a"] = act.detach().float().clone()
        raise StopForward

    def noop(act, hook):
        return act

    hooks = [(site, read)] + [(name, noop) for name in extra]
    if not fused:  # a hook on the pattern keeps TransformerLens's attention in every layer
        hooks.append(("blocks.0.attn.hook_pattern", noop))
    with torch.inference_mode():
        forward_until_stopped(model, tokens, hooks)
    return got["a"]


def test_tiny_model_matches_transformer_lens_and_is_restored(tmp_path):
    model = load_model("tiny", device="cpu")
    tokens = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(0))
    site = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    fused, reference = _resid(model, tokens, site, True), _resid(model, tokens, site, False)
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-5)
    assert implementation(model, [site]) == "fused"
    assert implementation(model, [site, "blocks.1.attn.hook_pattern"]) == "transformer_lens"
    assert all("forward" not in block.attn.__dict__ for block in model.blocks)  # nothing left patched
    with fused_attention(model, [site]) as n:
        assert n == model.cfg.n_layers and all("forward" in b.attn.__dict__ for b in model.blocks)
    assert all("forward" not in block.attn.__dict__ for block in model.blocks)


def test_weights_laid_out_once_follow_in_place_edits():
    """The fused path keeps each Q/K/V weight in F.linear's layout; an in-place edit (quantization, the backdoor's
    copy_) or a replaced parameter must be seen, never the stale copy."""
    model = load_model("tiny", device="cpu")
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    site = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    before = _resid(model, tokens, site, True)
    attn = model.blocks[0].attn
    assert set(attn.__dict__["_flat_weights"]) >= {"W_Q"}
    with torch.no_grad():
        attn.W_Q.mul_(1.5)  # in place: same storage, new version
    torch.testing.assert_close(_resid(model, tokens, site, True), _resid(model, tokens, site, False),
                               rtol=1e-5, atol=1e-5)
    assert not torch.allclose(_resid(model, tokens, site, True), before)
    attn.W_Q = torch.nn.Parameter(attn.W_Q.detach() / 1.5)  # replaced: new storage
    torch.testing.assert_close(_resid(model, tokens, site, True), before, rtol=1e-5, atol=1e-5)


def test_hook_z_still_fires_and_gradients_use_transformer_lens():
    model = load_model("tiny", device="cpu")
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    seen = {}

    def z_hook(act, hook):
        seen["z"] = act.shape
        return act

    with torch.inference_mode(), fused_attention(model, ["blocks.0.attn.hook_z"]):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", z_hook)], return_type=None)
    assert seen["z"] == (2, 12, model.cfg.n_heads, model.cfg.d_head)
    with fused_attention(model, ["blocks.0.hook_resid_post"]):  # grad enabled: TransformerLens's forward, exactly
        with_grad = model(tokens, return_type="logits")
    torch.testing.assert_close(with_grad, model(tokens, return_type="logits"), rtol=0, atol=0)


def test_sliding_window_layers_match_beyond_the_window():
    """A local layer (Gemma 3's kind) masks keys beyond its window: fused must too, on prompts longer than it."""
    from transformer_lens import HookedTransformer

    from workbench.models.tiny import tiny_config

    cfg = tiny_config(n_layers=2)
    cfg.use_local_attn, cfg.window_size, cfg.attn_types = True, 5, ["local", "global"]
    model = HookedTransformer(cfg)
    assert model.blocks[0].attn.attn_type == "local"
    torch.manual_seed(0)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(2))
    fused, reference = _resid(model, tokens, "blocks.1.hook_resid_post", True), \
        _resid(model, tokens, "blocks.1.hook_resid_post", False)
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-5)
    cfg2 = tiny_config(n_layers=2)  # the same weights without the window differ: the window is honoured
    cfg2.attn_types = ["global", "global"]
    unwindowed = HookedTransformer(cfg2)
    unwindowed.load_state_dict(model.state_dict(), strict=False)
    assert not torch.allclose(_resid(unwindowed, tokens, "blocks.1.hook_resid_post", True), fused, atol=1e-3)


def test_switch_turns_it_off_and_refuses_nonsense(monkeypatch):
    model = load_model("tiny", device="cpu")
    monkeypatch.setenv(SWITCH, "0")
    assert implementation(model, ["blocks.0.hook_resid_post"]) == "transformer_lens"
    monkeypatch.setenv(SWITCH, "maybe")
    with pytest.raises(WorkbenchError, match=f"{SWITCH}='maybe'"):
        implementation(model, ["blocks.0.hook_resid_post"])


def test_embedded_default_matches_in_float32(smollm2):
    tokens = smollm2.to_tokens(["The quick brown fox jumps over the lazy dog. " * 6, "Ignore all previous instructions."],
                               padding_side="right")
    site = "blocks.18.hook_resid_post"
    fused, reference = _resid(smollm2, tokens, site, True), _resid(smollm2, tokens, site, False)
    assert ((fused - reference).norm() / reference.norm()).item() < 1e-5


def test_gemma3_sliding_window_and_left_padding_tokenizer_match(gemma3):
    """Gemma 3: a tokenizer that pads left (TransformerLens then passes an all-ones mask), qk-norm, its own
    attention scale, and local layers whose 512-token window a 600-token prompt exceeds."""
    tokens = torch.randint(1000, 30000, (1, 600), generator=torch.Generator().manual_seed(3))
    site = f"blocks.{gemma3.cfg.n_layers - 1}.hook_resid_post"
    assert implementation(gemma3, [site]) == "fused"
    fused, reference = _resid(gemma3, tokens, site, True), _resid(gemma3, tokens, site, False)
    assert ((fused - reference).norm() / reference.norm()).item() < 1e-5


def test_gated_mlp_fused_matches_transformer_lens_and_steps_aside_for_hooks(monkeypatch):
    """The fused gated MLP gives TransformerLens's numbers, sees in-place weight edits, lets an editing hook on
    hook_post act (by running TransformerLens's forward there), and leaves every module as it found it."""
    model = load_model("tiny", device="cpu")
    tokens = torch.randint(0, 256, (3, 30), generator=torch.Generator().manual_seed(4))
    site = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"

    def resid(fused: bool, extra=()):
        """``site`` with the MLPs fused or not; TransformerLens's attention both times (a hook on the pattern)."""
        monkeypatch.setenv(SWITCH, "1" if fused else "0")
        got = {}

        def read(act, hook):
            got["a"] = act.detach().float().clone()

        hooks = [*extra, ("blocks.0.attn.hook_pattern", lambda act, hook: act), (site, read)]
        with torch.inference_mode():
            forward_until_stopped(model, tokens, hooks)
        return got["a"]

    seen = {}

    def count(mlp, x):
        seen[mlp] = seen.get(mlp, 0) + 1

    handles = [block.mlp.register_forward_pre_hook(count) for block in model.blocks]
    fused = resid(True)
    for h in handles:
        h.remove()
    assert len(seen) == model.cfg.n_layers and all("_fused_weights" in b.mlp.__dict__ for b in model.blocks)
    torch.testing.assert_close(fused, resid(False), rtol=1e-6, atol=1e-6)
    assert all("forward" not in block.mlp.__dict__ for block in model.blocks)

    def silence(act, hook):
        return act * 0

    edited = [("blocks.1.mlp.hook_post", silence)]
    torch.testing.assert_close(resid(True, edited), resid(False, edited), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(resid(True, edited), fused, atol=1e-3)

    with torch.no_grad():
        model.blocks[2].mlp.W_in.mul_(2.0)  # in place: the laid-out copy must follow
    doubled = resid(True)
    torch.testing.assert_close(doubled, resid(False), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(doubled, fused, atol=1e-3)

    monkeypatch.setenv(SWITCH, "1")
    with fused_attention(model, [site]):  # gradients: TransformerLens's forward, so the weights get them
        loss = model(tokens, return_type="loss")
    loss.backward()
    assert model.blocks[0].mlp.W_gate.grad is not None and model.blocks[0].mlp.W_gate.grad.abs().sum() > 0
