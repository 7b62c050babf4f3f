"""Generation on the tiny model: KV cache vs recompute, hooks at every step, stop strings, seeds, (Soft) BoN."""

import math

import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.tools.generate import (
    best_of_n,
    generate,
    kl_bound,
    probe_reward,
    prompt_ids,
    score,
    selection_kl,
    selection_probs,
    soft_best_of_n,
    steer_hooks,
    target_logprob_reward,
)


def naive_greedy(model, prompt, steps, hooks=()):
    x = torch.tensor([prompt_ids(model, prompt)])
    out = []
    with torch.inference_mode(), model.hooks(fwd_hooks=list(hooks)):
        for _ in range(steps):
            t = int(model(x)[0, -1].argmax())
            out.append(t)
            x = torch.cat([x, torch.tensor([[t]])], 1)
    return out


def force_token(model, t):
    """Replace the final normalized residual by a large multiple of W_U[:, t]: logits peak at t alone."""
    v = model.W_U[:, t].detach() * 1e3

    def hook(act, hook):
        return v.to(act.dtype).expand_as(act).clone()

    return [("ln_final.hook_normalized", hook)]


def test_kv_cache_greedy_equals_recompute(tiny):
    kv = generate(tiny, "The cat sat", max_new_tokens=12)[0]["tokens"]
    assert kv == naive_greedy(tiny, "The cat sat", 12)


def test_steering_hook_active_every_step_matches_recompute(tiny):
    hooks = steer_hooks(tiny, "neuron:1:5:20")
    kv = generate(tiny, "abc", hooks=hooks, max_new_tokens=8)[0]["tokens"]
    assert kv == naive_greedy(tiny, "abc", 8, hooks)
    assert kv != naive_greedy(tiny, "abc", 8)


def test_hook_forces_token_even_when_sampling(tiny):
    t = ord("z") - 0  # any id below the vocab
    for temperature in (0.0, 1.5):
        s = generate(tiny, "hi", hooks=force_token(tiny, t), max_new_tokens=5, temperature=temperature, n=2)
        assert all(x["tokens"] == [t] * 5 for x in s)
        assert all(abs(x["logprob"]) < 1e-4 for x in s)


def test_stop_strings_cut(tiny):
    full = generate(tiny, "hello", max_new_tokens=10)[0]
    stop = full["text"][3:5]
    cut = generate(tiny, "hello", max_new_tokens=10, stop=[stop])[0]
    assert cut["stopped"] == "stop"
    assert stop not in cut["text"] and full["text"].startswith(cut["text"])
    assert len(cut["tokens"]) < len(full["tokens"])


def test_seeded_sampling_and_logprobs(tiny):
    a = generate(tiny, "x", max_new_tokens=6, temperature=1.0, top_k=50, top_p=0.9, n=3, seed=7)
    b = generate(tiny, "x", max_new_tokens=6, temperature=1.0, top_k=50, top_p=0.9, n=3, seed=7)
    c = generate(tiny, "x", max_new_tokens=6, temperature=1.0, top_k=50, top_p=0.9, n=3, seed=8)
    assert a == b and a != c
    # at temperature 1 without truncation the sampling log-prob is the model's log-prob
    d = generate(tiny, "x", max_new_tokens=6, temperature=1.0, n=2, seed=1)
    assert all(math.isclose(s["logprob"], s["model_logprob"], abs_tol=1e-4) for s in d)
    assert all(s["logprob"] >= s["model_logprob"] - 1e-4 for s in a)  # truncation only raises q


def test_chat_template(tiny):
    ids = prompt_ids(tiny, "hi", chat=True)
    assert "<|assistant|>" in tiny.tokenizer.decode(ids)
    assert generate(tiny, "hi", chat=True, max_new_tokens=2)[0]["n_prompt_tokens"] == len(ids)


def test_soft_bon_limits_and_kl_bound(tiny):
    def reward(prompt, text):  # a reward in [0, 1]
        return sum(ch.isalpha() for ch in text) / max(1, len(text))

    kw = dict(max_new_tokens=4, seed=3)
    hard = best_of_n(tiny, "q", reward, 6, **kw)
    assert hard["chosen_reward"] == max(hard["rewards"])
    sharp = soft_best_of_n(tiny, "q", reward, 6, 1e-9, **kw)
    assert sharp["chosen"] == hard["chosen"] and sharp["samples"] == hard["samples"]
    flat = soft_best_of_n(tiny, "q", reward, 6, 1e9, **kw)
    assert flat["kl_empirical"] < 1e-9 and abs(flat["reward_gain"]) < 1e-6
    for lam in (0.05, 0.3, 1.0, 3.0):
        out = soft_best_of_n(tiny, "q", reward, 6, lam, **kw)
        assert out["kl_empirical"] <= out["kl_bound"] + 1e-12
        assert out["kl_empirical"] <= out["kl_bound_range"] + 1e-12
        assert out["reward_gain"] >= -1e-12


def test_selection_kl_bound_on_random_pools():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(2, 20, (1,), generator=g))
        r = torch.rand(n, generator=g) * 5
        lam = float(torch.rand(1, generator=g)) * 3 + 1e-3
        kl = selection_kl(selection_probs(r.tolist(), lam))
        assert kl <= kl_bound(n, lam, float(r.max() - r.min())) + 1e-9
    assert math.isclose(kl_bound(8, 0.0), math.log(8)) and kl_bound(8, math.inf) == 0.0


def test_true_kl_below_pool_estimate_below_bound():
    """Exact Soft BoN over a 3-outcome base sampler (all 3^N pools): true KL <= E_pool KL <= bound."""
    import itertools

    q = torch.tensor([0.9, 0.08, 0.02], dtype=torch.float64)
    r = [0.0, 0.5, 1.0]
    n, lam = 4, 0.3
    marginal = torch.zeros(3, dtype=torch.float64)
    pool_kl = 0.0
    for pool in itertools.product(range(3), repeat=n):
        w = float(q[list(pool)].prod())
        p = selection_probs([r[i] for i in pool], lam)
        for i, pi in zip(pool, p.tolist(), strict=True):
            marginal[i] += w * pi
        pool_kl += w * selection_kl(p)
    true_kl = float((marginal * (marginal / q).log()).sum())
    assert math.isclose(float(marginal.sum()), 1.0)
    assert 0 < true_kl <= pool_kl <= kl_bound(n, lam)


def test_rewards(tiny):
    s = generate(tiny, "ab", max_new_tokens=3)
    lp = score(target_logprob_reward(tiny, "cd"), "ab", s)[0]
    assert lp < 0
    d = torch.zeros(tiny.cfg.d_model)
    d[0] = 1
    pr = score(probe_reward(tiny, "blocks.1.hook_resid_post", d), "ab", s)[0]
    assert math.isfinite(pr)


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(n=0),
                                    dict(top_k=-1), dict(max_new_tokens=0)])
def test_bad_sampling_input(tiny, kwargs):
    with pytest.raises(WorkbenchError):
        generate(tiny, "a", **kwargs)


def test_bad_selection_input(tiny):
    with pytest.raises(WorkbenchError, match="NaN|nan"):
        soft_best_of_n(tiny, "a", lambda p, t: float("nan"), 2, 1.0, max_new_tokens=2)
    with pytest.raises(WorkbenchError):
        soft_best_of_n(tiny, "a", lambda p, t: 0.0, 2, -1.0, max_new_tokens=2)
    with pytest.raises(WorkbenchError):
        best_of_n(tiny, "a", lambda p, t: 0.0, 2, temperature=0.0, max_new_tokens=2)
    with pytest.raises(WorkbenchError):
        kl_bound(0, 1.0)
    for spec in ("neuron:1:5", "neuron:99:0:2", "bogus"):
        with pytest.raises(WorkbenchError):
            steer_hooks(tiny, spec)


def test_feature_steering_spec_loads_an_saelens_sae(tiny, tmp_path):
    """feature:SAE:idx:scale adds the feature's decoder direction at its site during generation."""
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

    torch.manual_seed(0)
    sae = TopKSAE(TopKSAEConfig(d_in=tiny.cfg.d_model, d_sae=32, k=4,
                                metadata=SAEMetadata(hook_name="blocks.1.hook_resid_post", model_name="tiny")))
    sae.save_model(str(tmp_path / "sae"))
    hooks = steer_hooks(tiny, f"feature:{tmp_path / 'sae'}:3:40")
    assert [name for name, _ in hooks] == ["blocks.1.hook_resid_post"]
    steered = generate(tiny, "abc", hooks=hooks, max_new_tokens=8)[0]["tokens"]
    assert steered == naive_greedy(tiny, "abc", 8, hooks) and steered != naive_greedy(tiny, "abc", 8)
    for spec in (f"feature:{tmp_path / 'sae'}:999:1", f"feature:{tmp_path / 'sae'}:x:1"):
        with pytest.raises(WorkbenchError):
            steer_hooks(tiny, spec)
