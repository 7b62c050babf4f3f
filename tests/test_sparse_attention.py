"""Sparse attention: selectors on synthetic heads, KV-cached decoding on the tiny model, bad input."""

import pytest
import torch

from workbench.commands.attention import run_attention_eval
from workbench.errors import WorkbenchError
from workbench.tools import sparse_attention as sa


def synthetic_head(n=512, d=32, kv=2, g=2, n_clusters=32, seed=0):
    """Clustered keys and queries aligned with a few clusters: peaked, realistic-looking attention."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(n_clusters, d, generator=gen) * 3
    assign = torch.randint(0, n_clusters, (n,), generator=gen)
    keys = (centers[assign] + 0.3 * torch.randn(n, d, generator=gen))[None, :, None].expand(1, n, kv, d).clone()
    q = (centers[:g * kv] + 0.3 * torch.randn(g * kv, d, generator=gen))[None] * 0.5  # [1, h, d]
    scores = torch.einsum("bhd,bnhd->bhn", q, keys.repeat_interleave(g, dim=2)) / d**0.5
    return scores, q, keys


def recall(scores, mask):
    kv = mask.shape[1]
    return (scores.softmax(-1) * mask.repeat_interleave(scores.shape[1] // kv, 1)).sum(-1).min().item()


def test_top_p_mask_is_minimal():
    probs = torch.tensor([[0.5, 0.05, 0.3, 0.15]])
    assert sa.top_p_mask(probs, 0.8).tolist() == [[True, False, True, False]]
    assert sa.top_p_mask(probs, 0.81).tolist() == [[True, False, True, True]]
    assert sa.top_p_mask(probs, 1.0).all()


def test_kmeans_recovers_separated_clusters():
    gen = torch.Generator().manual_seed(0)
    centers = torch.tensor([[10.0, 0], [0, 10.0], [-10.0, 0]])
    labels = torch.arange(60) % 3
    x = (centers[labels] + 0.1 * torch.randn(60, 2, generator=gen))[None]
    _, assign = sa.kmeans(x, 3, iters=10)
    for c in range(3):
        assert assign[0, labels == c].unique().numel() == 1
    assert assign[0].unique().numel() == 3


def test_tactic_reaches_the_mass_with_few_keys():
    """With keys the clustering separates (seed 1), Tactic reaches the mass with a fraction of the keys.

    (With seed 0, k-means merges the query's cluster with others and Tactic misses it: the
    method is only as good as its clustering.)
    """
    scores, q, keys = synthetic_head(seed=1)
    oracle = sa.TopP(0.9).select(0, scores, q, keys, 512)
    tactic = sa.Tactic(0.9).select(0, scores, q, keys, 512)
    assert tactic.shape == (1, 2, 512)
    assert recall(scores, oracle) >= 0.9
    assert recall(scores, tactic) >= 0.85
    assert tactic.float().mean() < 0.3  # far fewer than all keys
    no_bridge = sa.Tactic(0.9, bridge=False).select(0, scores, q, keys, 512)
    assert recall(scores, no_bridge) <= recall(scores, tactic)  # the bridge only ever adds to the fitted tail
    assert no_bridge.sum() <= tactic.sum()


def test_new_tokens_always_attended():
    scores, q, keys = synthetic_head()
    for sel in (sa.Tactic(0.5), sa.Quest(32), sa.StreamingLLM(32)):
        assert sel.select(0, scores, q, keys, 500)[..., 500:].all()


def test_quest_bound_is_an_upper_bound():
    scores, q, keys = synthetic_head(n=64)
    sel = sa.Quest(budget=16, page=16)
    sel.select(0, scores, q, keys, 64)
    kmin, kmax = sel.pages[0]
    true_max = torch.einsum("hd,nd->hn", q[0], keys[0, :, 0]).reshape(q.shape[1], 4, 16).amax(-1)
    bound = torch.maximum(q[0, :, None] * kmin[0, 0], q[0, :, None] * kmax[0, 0]).sum(-1)
    assert (bound >= true_max - 1e-4).all()


def test_streaming_and_topk_budgets():
    scores, q, keys = synthetic_head(n=100)
    m = sa.StreamingLLM(budget=20, sinks=4).select(0, scores, q, keys, 100)
    assert m[0, 0].nonzero().flatten().tolist() == [0, 1, 2, 3, *range(84, 100)]
    assert (sa.TopK(budget=10).select(0, scores, q, keys, 100).sum(-1) == 10).all()


def test_h2o_evicted_keys_stay_evicted():
    sel = sa.H2O(budget=16, recent=4)
    scores, q, keys = synthetic_head(n=64)
    sel.observe(0, scores.softmax(-1).reshape(1, 2, 2, 64).sum(2))
    first = sel.select(0, scores, q, keys, 64)
    assert (first.sum(-1) <= 16).all()
    scores2, q2, keys2 = synthetic_head(n=65, seed=1)
    second = sel.select(0, scores2, q2, keys2, 64)
    assert not (second[..., :60] & ~first[..., :60]).any()
    assert second[..., 64].all()


@pytest.fixture(scope="module")
def tiny_setup():
    from workbench.models.tiny import tiny_model

    model = tiny_model(seed=0)
    tokens = model.to_tokens("The quick brown fox jumps over the lazy dog. " * 4)[:, :160]
    return model, tokens, sa.prefill(model, tokens[:, :128], chunk=50)


def test_full_selector_decode_matches_dense_forward(tiny_setup):
    model, tokens, pre = tiny_setup
    with torch.no_grad():
        dense = model(tokens).log_softmax(-1)[:, 128:-1]
    out = sa.decode(model, tokens, 128, sa.Full(), prefilled=pre)
    assert out["logprobs"].shape == dense.shape
    assert torch.allclose(out["logprobs"], dense, atol=1e-4)
    assert out["metrics"]["loaded"] == [1.0] * model.cfg.n_layers


def test_sparse_decode_changes_output_and_reports_metrics(tiny_setup):
    model, tokens, pre = tiny_setup
    full = sa.decode(model, tokens, 128, sa.Full(), prefilled=pre)["logprobs"]
    out = sa.decode(model, tokens, 128, sa.StreamingLLM(budget=16), prefilled=pre)
    assert not torch.allclose(out["logprobs"], full, atol=1e-3)
    assert all(0 < v < 0.3 for v in out["metrics"]["loaded"])
    assert all(0 < r < 1 for r in out["metrics"]["recall"])
    again = sa.decode(model, tokens, 128, sa.Full(), prefilled=pre)["logprobs"]  # the prefill cache is untouched
    assert torch.equal(again, full)


@pytest.mark.parametrize(
    "call",
    [
        lambda: sa.TopP(0.0),
        lambda: sa.Tactic(1.5),
        lambda: sa.make_selector("tactic", p=-0.1),
        lambda: sa.TopK(0),
        lambda: sa.Quest(16, page=0),
        lambda: sa.make_selector("oracle"),
    ],
)
def test_bad_input(call):
    with pytest.raises(WorkbenchError) as info:
        call()
    assert "\n" not in str(info.value)


def test_bad_prefill_length(tiny_setup):
    model, tokens, _ = tiny_setup
    with pytest.raises(WorkbenchError, match="n_prefill"):
        sa.decode(model, tokens[:, :10], 9, sa.Full())


def test_cluster_cache_is_a_sorted_permutation_of_the_keys():
    _, _, keys = synthetic_head(n=200, kv=2)
    k = keys[0].transpose(0, 1).contiguous() + torch.randn(2, 200, 32, generator=torch.Generator().manual_seed(3))
    v = torch.randn_like(k)
    cache = sa.cluster_cache(k, v)
    assert cache.centroids.shape == (2, 1 + 13, 32) and int(cache.sizes.sum()) == 400  # the sink, then k-means
    for h in range(2):
        assert sorted(cache.perm[h].tolist()) == list(range(200))
        assert torch.equal(cache.keys[h], k[h, cache.perm[h]]) and torch.equal(cache.values[h], v[h, cache.perm[h]])
        assert (cache.cluster_of[h].diff() >= 0).all()  # each cluster is one contiguous run of rows
        assert cache.sizes[h, 0] == 1 and cache.perm[h, 0] == 0 and torch.equal(cache.centroids[h, 0], k[h, 0])
        for c in range(14):
            run = cache.cluster_of[h, cache.starts[h, c]: cache.starts[h, c] + cache.sizes[h, c]]
            assert (run == c).all()
    everything = torch.ones(2, 14, dtype=torch.bool)
    assert cache.key_mask(everything).all() and cache.loaded(everything) == 1.0


def kernel_case(n=1024, seed=2):
    scores, q, keys = synthetic_head(n=n, d=32, kv=2, g=2, seed=seed)
    k = keys[0].transpose(0, 1).contiguous()
    v = torch.randn(k.shape, generator=torch.Generator().manual_seed(seed))
    return q[0], k, v, sa.cluster_cache(k, v)


@pytest.mark.parametrize("backend", ["torch", "numba"])
def test_tactic_decode_attention_matches_dense_at_p_one_and_loads_less_below(backend):
    q, k, v, cache = kernel_case()
    dense = sa.decode_attention(q, k, v)
    out, chosen = sa.tactic_decode_attention(q, cache, sa.Tactic(1.0), backend=backend)
    assert chosen.all() and torch.allclose(out, dense, atol=1e-5)
    out, chosen = sa.tactic_decode_attention(q, cache, sa.Tactic(0.9), backend=backend)
    assert cache.loaded(chosen) < 0.5
    assert ((out - dense).norm() / dense.norm()) < 0.5
    new_k, new_v = torch.randn(2, 3, 32), torch.randn(2, 3, 32)  # decoded tokens are always attended
    with_new, _ = sa.tactic_decode_attention(q, cache, sa.Tactic(1.0), new_k, new_v, backend=backend)
    full = sa.decode_attention(q, torch.cat([k, new_k], 1), torch.cat([v, new_v], 1))
    assert torch.allclose(with_new, full, atol=1e-5)


@pytest.mark.parametrize("seed", [1, 2, 5])
@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
def test_compiled_cpu_kernel_chooses_what_the_torch_selection_chooses(seed, p):
    """The numba kernel is a second implementation of ``tactic_select``: same clusters, same output."""
    q, k, v, cache = kernel_case(n=2048, seed=seed)
    new_k, new_v = torch.randn(2, 4, 32), torch.randn(2, 4, 32)
    ref, chosen_ref = sa.tactic_decode_attention(q, cache, sa.Tactic(p), new_k, new_v, backend="torch")
    out, chosen = sa.tactic_decode_attention(q, cache, sa.Tactic(p), new_k, new_v, backend="numba")
    assert torch.equal(chosen, chosen_ref)
    assert torch.allclose(out, ref, atol=1e-5)


def test_kernel_refuses_what_it_cannot_run_in_one_line():
    q, k, v, cache = kernel_case(n=256)
    calls = [lambda: sa.tactic_decode_attention(q, cache, backend="cuda"),
             lambda: sa.tactic_decode_attention(q.double(), cache, backend="numba"),
             lambda: sa.tactic_decode_attention(q, sa.cluster_cache(k), backend="torch")]
    for call in calls:
        with pytest.raises(WorkbenchError) as info:
            call()
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("backend", ["torch", "numba"])
def test_where_the_scored_prefix_starts_changes_the_speed_not_the_choice(backend):
    """The prefix doubles until the stopping rule stops inside it; the masses below the depth are exact in every
    round, so the clusters chosen do not depend on ``first_frac``."""
    for seed in (1, 4):
        q, k, v, cache = kernel_case(n=2048, seed=seed)
        chosen = [sa.tactic_decode_attention(q, cache, sa.Tactic(0.9, first_frac=f), backend=backend)[1]
                  for f in (0.005, 0.02, 0.25, 1.0)]
        assert all(torch.equal(c, chosen[0]) for c in chosen[1:])


def test_selector_on_model_scores_picks_what_the_kernel_picks():
    """The quality numbers (the selector, reading the model's scores) are those of the timed kernel's keys."""
    scores, q, keys = synthetic_head(n=1024, d=32, kv=2, g=2, seed=1)
    mask = sa.Tactic(0.9).select(0, scores, q, keys, 1024)
    k = keys[0].transpose(0, 1).contiguous()
    cache = sa.cluster_cache(k, torch.zeros_like(k))
    _, chosen = sa.tactic_decode_attention(q[0], cache, sa.Tactic(0.9), backend="torch")
    assert torch.equal(mask[0], cache.key_mask(chosen))


def test_the_attention_sink_is_a_cluster_of_its_own_and_is_read():
    """Gemma 3's global layers put much of their mass on position 0; hidden in a k-means cluster it was missed
    (KL 0.078 at P = 0.9, 0.001 with the sink apart)."""
    scores, q, keys = synthetic_head(n=1024, d=32, kv=2, g=2, seed=3)
    keys = keys.clone()
    keys[0, 0] = q[0].reshape(2, 2, 32).mean(1) * 6  # a key far from the rest, in the queries' direction
    scores = torch.einsum("bhd,bnhd->bhn", q, keys.repeat_interleave(2, dim=2)) / 32**0.5
    assert (scores.softmax(-1)[..., 0] > 0.3).all()  # a sink
    mask = sa.Tactic(0.9).select(0, scores, q, keys, 1024)
    assert mask[..., 0].all() and recall(scores, mask) >= 0.9
    k = keys[0].transpose(0, 1).contiguous()
    cache = sa.cluster_cache(k, torch.randn_like(k))
    assert torch.equal(cache.key_mask(sa.tactic_decode_attention(q[0], cache, sa.Tactic(0.9))[1]), mask[0])


def test_window_layers_attend_their_window_densely():
    """Gemma 3's sliding-window layers keep the model's window; only global layers are sparsified."""
    from transformer_lens import HookedTransformer

    from workbench.models.tiny import byte_tokenizer, tiny_config

    cfg = tiny_config(n_layers=2)
    cfg.use_local_attn, cfg.window_size, cfg.attn_types = True, 16, ["local", "global"]
    model = HookedTransformer(cfg, tokenizer=byte_tokenizer(), move_to_device=False).eval()
    assert sa.layer_types(model) == ["local", "global"]
    tokens = model.to_tokens("The quick brown fox jumps over the lazy dog. " * 4)[:, :140]
    out = sa.decode(model, tokens, 128, sa.StreamingLLM(budget=32))
    loaded = out["metrics"]["loaded"]
    steps = tokens.shape[1] - 1 - 128
    assert loaded[0] == pytest.approx(sum(16 / (128 + i + 1) for i in range(steps)) / steps)
    assert loaded[1] == pytest.approx(sum(32 / (128 + i + 1) for i in range(steps)) / steps)
    assert out["metrics"]["recall"][0] == pytest.approx(1.0)  # the model itself attends nothing else
    rows = sa.compare_attention(model, tokens, 128, ["full", "streaming:32"], progress=False)
    assert rows[1]["loaded_local"] == pytest.approx(loaded[0]) and rows[1]["loaded_global"] == pytest.approx(loaded[1])


def test_compare_attention_rows(tiny_setup):
    model, tokens, _ = tiny_setup
    rows = sa.compare_attention(model, tokens, 128, ["full", "tactic:0.9", "topk:auto", "streaming:32"],
                                progress=False)
    by = {r["method"].split(":")[0]: r for r in rows}
    assert by["full"]["kl"] == pytest.approx(0, abs=1e-6) and by["full"]["loaded"] == 1
    assert by["topk"]["method"] == f"topk:{round(by['tactic']['loaded'] * 128)}"
    assert by["streaming"]["kl"] > 0 and by["streaming"]["loaded"] < 1
    with pytest.raises(WorkbenchError, match="tactic method listed before"):
        sa.compare_attention(model, tokens, 128, ["topk:auto"], progress=False)


def test_run_attention_eval_writes_results(tmp_path):
    (tmp_path / "text.txt").write_text("Plain words for a short test of the sparse attention study. " * 40)
    rows = run_attention_eval("tiny", ["full", "tactic:0.9", "h2o:auto"], out=tmp_path / "out", context=96,
                                 decode_steps=8, split="all", source=str(tmp_path / "text.txt"), progress=False)
    assert [r["method"].split(":")[0] for r in rows] == ["full", "tactic", "h2o"]
    assert all((tmp_path / "out" / f).exists() for f in ("results.csv", "results.json", "figure.html"))
    with pytest.raises(WorkbenchError, match="exceeds"):
        run_attention_eval("tiny", ["full"], context=600, decode_steps=8)


def test_drift_of_decoded_positions_against_full_attention(tiny_setup):
    """Recorded streams are one row per decoded position; full vs itself has no drift, a 4-key window has some."""
    model, tokens, pre = tiny_setup
    out = sa.decode(model, tokens, 128, sa.Full(), prefilled=pre, record_sites=["blocks.1.hook_resid_post"])
    assert out["streams"]["blocks.1.hook_resid_post"].shape == (tokens.shape[1] - 129, model.cfg.d_model)
    rows = sa.compare_attention(model, tokens, 128, ["full", "streaming:4"], progress=False, topology_layers=[0, 1],
                                topology_k=24)
    full, window = rows
    assert full["ph_bottleneck_h0_mean"] < 1e-12 and full["ph_layers"] == [0, 1]
    assert window["ph_bottleneck_h0_mean"] > 0 and len(window["ph_bottleneck_h1_per_layer"]) == 2


def test_plain_tensor_kernels_live_in_workbench_kernels():
    """The timed kernels are the kernels package's; the Tactic selector shares their stopping rule."""
    from workbench.kernels import attention

    for name in ("decode_attention", "tactic_decode_attention", "tactic_select", "cluster_cache", "kmeans"):
        assert getattr(sa, name) is getattr(attention, name)
    assert isinstance(sa.Tactic(0.8), attention.TailFit)
    assert sa.Tactic.count is attention.TailFit.count


def test_compare_attention_resumes_from_its_finished_methods(tiny_setup, tmp_path, monkeypatch):
    """Each finished method's row is kept: a second run decodes only full attention (its reference) and what it
    lacks, `auto` budgets come from the kept Tactic row, and another model built in code shares nothing."""
    model, tokens, _ = tiny_setup
    import copy
    import json

    import workbench.tools.sparse_attention.evaluate as evaluate_module

    decoded = []
    decode = evaluate_module.decode
    monkeypatch.setattr(evaluate_module, "decode", lambda m, t, n, selector, **k:
                        decoded.append(type(selector).__name__) or decode(m, t, n, selector, **k))
    methods = ["full", "tactic:0.9", "topk:auto"]
    first = sa.compare_attention(model, tokens, 128, methods, progress=False, cache=tmp_path)
    assert decoded == ["Full", "Full", "Tactic", "TopK"]
    again = sa.compare_attention(model, tokens, 128, [*methods, "streaming:32"], progress=False, cache=tmp_path)
    assert decoded[4:] == ["Full", "StreamingLLM"]
    assert json.dumps(again[:3], sort_keys=True) == json.dumps(first, sort_keys=True, default=lambda o: o.item())
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.blocks[0].attn.W_Q.mul_(1.5)  # other weights, same config and no recorded hash
    sa.compare_attention(other, tokens, 128, ["full"], progress=False, cache=tmp_path)
    assert decoded[6:] == ["Full", "Full"] and len(list(tmp_path.iterdir())) == 2
