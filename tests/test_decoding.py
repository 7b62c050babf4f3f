"""The shared KV-cached decoding loop: equal to recomputing the whole sequence, chunking changes nothing,
and generation and sparse-attention decoding both run through it."""

import torch

from workbench.models.kv_cache import new_cache
from workbench.tools import decoding
from workbench.tools import sparse_attention as sa
from workbench.tools.generate import generate, prompt_ids


def full_forward_greedy(model, ids, steps):
    x = torch.tensor([ids])
    out = []
    with torch.inference_mode():
        for _ in range(steps):
            t = int(model(x)[0, -1].argmax())
            out.append(t)
            x = torch.cat([x, torch.tensor([[t]])], 1)
    return out


def loop_greedy(model, ids, steps, chunk=None):
    out = []

    def choose(step, logits):
        out.append(int(logits[0].argmax()))
        return None if step + 1 == steps else torch.tensor([[out[-1]]])

    decoding.decode_loop(model, new_cache(model, 1), torch.tensor([ids]), choose, chunk=chunk)
    return out


def test_loop_greedy_equals_full_forward_greedy(tiny):
    ids = prompt_ids(tiny, "The quick brown fox jumps over the lazy dog")
    want = full_forward_greedy(tiny, ids, 10)
    assert loop_greedy(tiny, ids, 10) == want
    assert loop_greedy(tiny, ids, 10, chunk=3) == want
    assert generate(tiny, "The quick brown fox jumps over the lazy dog", max_new_tokens=10)[0]["tokens"] == want


def test_chunked_prefill_equals_one_pass(tiny):
    tokens = torch.tensor([prompt_ids(tiny, "one two three four five six seven eight nine ten")] * 2)
    with torch.inference_mode():
        whole = decoding.prefill(tiny, tokens, new_cache(tiny, 2))
        chunked = decoding.prefill(tiny, tokens, new_cache(tiny, 2), chunk=4)
        dense = tiny(tokens)[:, -1].float()
    assert torch.allclose(whole, dense, atol=1e-4) and torch.allclose(chunked, dense, atol=1e-4)


def test_generate_and_sparse_decoding_share_the_loop(tiny, monkeypatch):
    calls = {"prefill": [], "step": 0}
    prefill, step = decoding.prefill, decoding.step

    def counting_prefill(model, tokens, cache, chunk=None):
        calls["prefill"].append((tokens.shape[1], chunk))
        return prefill(model, tokens, cache, chunk)

    def counting_step(model, token, cache):
        calls["step"] += 1
        return step(model, token, cache)

    monkeypatch.setattr(decoding, "prefill", counting_prefill)
    monkeypatch.setattr(decoding, "step", counting_step)

    out = generate(tiny, "abc", max_new_tokens=5)[0]
    assert calls == {"prefill": [(out["n_prompt_tokens"], None)], "step": 4}

    calls.update(prefill=[], step=0)
    tokens = tiny.to_tokens("The quick brown fox jumps over the lazy dog. " * 2)[:, :40]
    pre = sa.prefill(tiny, tokens[:, :30], chunk=8)
    assert calls == {"prefill": [(30, 8)], "step": 0}
    calls.update(prefill=[])
    sa.decode(tiny, tokens, 30, sa.StreamingLLM(budget=8), prefilled=pre)
    assert calls == {"prefill": [(1, None)], "step": 8}  # tokens 30..38 fed, the last is only a target
