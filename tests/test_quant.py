"""Quantization: transforms, quantizers, FP8, weights, hooks on the tiny model, evaluation, bad input."""

import math

import pytest
import torch

from workbench.commands.quant import run_quant_eval
from workbench.errors import WorkbenchError
from workbench.tools import quant
from workbench.tools import quant_eval as evaluate


def correlated_tokens(s=256, d=64, seed=0):
    """Activation-like data: a shared per-channel mean with outliers plus an AR(1) drift across tokens."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(d, generator=g) * 2
    mu[:3] *= 10  # outlier channels, as in real LLM activations
    noise = torch.randn(s, d, generator=g)
    ar = torch.zeros(s, d)
    for i in range(1, s):
        ar[i] = 0.95 * ar[i - 1] + 0.3 * noise[i]
    return mu + ar + 0.1 * torch.randn(s, d, generator=g)


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def tiny():
    from workbench.models.tiny import tiny_model

    return tiny_model(seed=0)


# ----------------------------------------------------------------------------- transforms

CASES = [("haar", n) for n in (1, 2, 7, 8, 37, 64)] + [("dct", n) for n in (1, 5, 64)] + [
    ("wht", n) for n in (1, 2, 16, 64)
]


@pytest.mark.parametrize("kind,n", CASES)
def test_transforms_orthonormal_and_invertible(kind, n):
    L = quant.transform_matrix(kind, n)
    assert torch.allclose(L.T @ L, torch.eye(n, dtype=torch.float64), atol=1e-5)
    x = torch.randn(3, n, 8)
    y = quant.sequence_transform(x, kind)
    assert torch.allclose(y.norm(), x.norm(), rtol=1e-5)  # energy preserved
    assert torch.allclose(quant.inverse_sequence_transform(y, kind), x, atol=1e-5)
    assert torch.allclose(y.double(), L @ x.double(), atol=1e-5)  # the matrix is the transform


def test_wht_is_in_sequency_order():
    H = quant.transform_matrix("wht", 32)
    changes = (torch.sign(H[:, 1:]) != torch.sign(H[:, :-1])).sum(1)
    assert changes.tolist() == list(range(32))


def test_haar_window_support():
    """Each Haar output mixes only the tokens of one aligned window of 2**levels (causality claim)."""
    L = quant.transform_matrix("haar", 64, levels=3)
    for row in L:
        cols = row.nonzero().flatten()
        assert cols.min() // 8 == cols.max() // 8


@pytest.mark.parametrize("kind", ["haar", "dct", "wht"])
def test_transform_concentrates_energy_of_smooth_sequence(kind):
    x = correlated_tokens(256)
    y = quant.sequence_transform(x, kind)
    energy = y.pow(2).sum(-1)
    assert energy[:32].sum() / energy.sum() > 0.9  # 1/8 of the tokens carry > 90 % of the energy


# ----------------------------------------------------------------------------- uniform quantization


def test_error_decreases_with_bits_and_vanishes_at_high_bits():
    x = torch.randn(16, 64)
    errs = [rel_err(quant.minmax_quantize(x, b), x) for b in (2, 3, 4, 6, 8, 12, 16)]
    assert all(a > b for a, b in zip(errs, errs[1:], strict=False))
    assert errs[-1] < 1e-4
    grid = torch.randint(0, 16, (8, 32)).float()  # values on a 4-bit grid are exact at 4 bits
    grid[:, 0], grid[:, 1] = 0, 15
    assert torch.equal(quant.minmax_quantize(grid, 4), grid)


def test_per_token_minmax_error_bound():
    x = torch.randn(32, 64) * torch.logspace(-2, 2, 32)[:, None]
    bits = torch.randint(2, 9, (32, 1))
    q = quant.minmax_quantize(x, bits)
    step = (x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / (2.0**bits - 1)
    assert ((q - x).abs() <= step / 2 * (1 + 1e-5) + 1e-6).all()


def test_stamp_beats_rtn_at_same_average_bits():
    x = correlated_tokens(256)
    stamp = rel_err(quant.stamp_quantize(x), x)  # 4 + 256/256 = 5 bits on average
    assert quant.average_bits(256, 4, 8, 64) == 5.0
    rtn5 = rel_err(quant.quantize_activations(x, 5), x)
    mixed_no_transform = rel_err(quant.quantize_activations(x, 4, "none", 64), x)
    assert stamp < 0.5 * rtn5
    assert stamp < 0.5 * mixed_no_transform
    for kind in ("dct", "wht"):
        assert rel_err(quant.stamp_quantize(x, transform=kind), x) < 0.5 * rtn5


def test_stamp_beats_rtn_on_tiny_model_activation(tiny):
    """On a model activation, STaMP beats per-token RTN with the same per-token bit budget.

    The baseline gets the same widths (64 tokens at 8 bits, the rest at 4) without the
    transform, so the average bit width is identical; only the transform differs.
    """
    text = "The quick brown fox jumps over the lazy dog. " * 12
    tokens = tiny.to_tokens(text)[:, :512]
    site = "blocks.3.ln2.hook_normalized"
    _, cache = tiny.run_with_cache(tokens, names_filter=site)
    x = cache[site][0]
    same_budget = rel_err(quant.quantize_activations(x, 4, "none", 64), x)
    assert rel_err(quant.stamp_quantize(x), x) < 0.8 * same_budget


def test_sink_token_kept_out_of_the_transform():
    """A huge first token ruins STaMP's first window unless it is quantized on its own."""
    x = correlated_tokens(256)
    x[0] *= 1000
    with_sink = quant.stamp_quantize(x, sink_tokens=1)
    without = quant.stamp_quantize(x)
    assert rel_err(with_sink[1:9], x[1:9]) < 0.1 * rel_err(without[1:9], x[1:9])
    assert torch.allclose(with_sink[:1], quant.minmax_quantize(x[:1], 8))
    assert quant.average_bits(256, 4, 8, 64, sink_tokens=1) == (65 * 8 + 191 * 4) / 256


def test_hadamard_rotation_orthogonal_and_spreads_outliers():
    for d in (64, 576, 96):
        R = quant.hadamard_rotation(d)
        assert torch.allclose(R @ R.T, torch.eye(d), atol=1e-5)
        x = torch.randn(3, 5, d)
        fast = quant.Hadamard(0)
        assert torch.allclose(fast.apply(x), x @ R, atol=1e-5)
        assert torch.allclose(fast.invert(fast.apply(x)), x, atol=1e-5)
    x = torch.randn(64, 64)
    x[:, 5] *= 100
    R = quant.hadamard_rotation(64)
    rotated = rel_err(quant.quantize_activations(x, 4, rotation=R), x)
    assert rotated < rel_err(quant.quantize_activations(x, 4), x)
    assert rel_err(quant.quantize_activations(x, 4, rotation=quant.Hadamard(0)), x) == pytest.approx(rotated, rel=1e-4)


# ----------------------------------------------------------------------------- FP8


def test_fp8_representable_values_exact_and_saturation():
    vals = torch.tensor([0.0, 1.0, -1.5, 0.875, 448.0, -448.0, 2.0**-6, 2.0**-9, 240.0, 3.25])
    assert torch.equal(quant.fp8_round(vals, "e4m3"), vals)
    assert quant.fp8_round(torch.tensor([500.0, 1e6, -1e6]), "e4m3").tolist() == [448.0, 448.0, -448.0]
    assert quant.fp8_round(torch.tensor([1e6]), "e5m2").item() == 57344.0
    assert quant.fp8_round(torch.tensor([1.0625]), "e4m3").item() == 1.0  # half step: round to even


def test_microscaling_beats_per_tensor_on_outlier_blocks():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 32, 256, generator=g)
    x[..., :32] *= 1e5  # one outlier block per token
    err = {s: rel_err(quant.fp8_quantize(x, "e4m3", s)[..., 32:], x[..., 32:]) for s in quant.FP8_SCALINGS}
    assert err["microscale"] < 0.5 * err["tensor"]
    assert err["group"] < 0.5 * err["tensor"]


def test_fp8_ragged_blocks_keep_shape():
    x = torch.randn(2, 5, 50)
    assert quant.fp8_quantize(x, block_size=32).shape == x.shape


# ----------------------------------------------------------------------------- weights and hooks


def test_rtn_weight_groups_and_restore(tiny):
    w = torch.randn(8, 100)
    e_channel = rel_err(quant.rtn_weight(w, 4), w)
    e_group = rel_err(quant.rtn_weight(w, 4, group_size=32), w)
    assert e_group < e_channel
    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    with quant.quantized_weights(tiny, bits=4, group_size=32):
        assert not torch.equal(tiny.blocks[0].mlp.W_in, before["blocks.0.mlp.W_in"])
        assert torch.equal(tiny.embed.W_E, before["embed.W_E"])
    assert all(torch.equal(v, before[k]) for k, v in tiny.state_dict().items())


def test_hooks_change_logits_at_4_bits_not_at_16(tiny):
    tokens = torch.randint(0, 256, (2, 96), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = tiny(tokens)
        with tiny.hooks(fwd_hooks=quant.stamp_hooks(tiny, bits=16, high_bits=16)):
            hi = tiny(tokens)
        with tiny.hooks(fwd_hooks=quant.stamp_hooks(tiny, bits=4, high_precision_tokens=8)):
            lo = tiny(tokens)
        with tiny.hooks(fwd_hooks=quant.fp8_hooks(tiny)):
            fp8 = tiny(tokens)
    assert rel_err(hi, ref) < 1e-3
    assert rel_err(lo, ref) > 1e-2
    assert 1e-4 < rel_err(fp8, ref) < rel_err(lo, ref)
    assert len(quant.rtn_activation_hooks(tiny, 8, layers=[1])) == 4


def test_norm_gain_is_quantized_with_the_input(tiny):
    """After an unfolded RMSNorm the hook quantizes normalized * w, the real input of W_Q/W_K/W_V."""
    seen = {}
    name = "blocks.0.ln1.hook_normalized"
    (site, fn), *_ = quant.activation_hooks(tiny, lambda x: seen.setdefault("x", x), layers=[0], sites=["attn_in"])
    assert site == name
    x = torch.randn(1, 4, 64)
    out = fn(x, None)
    assert torch.allclose(seen["x"], x * tiny.blocks[0].ln1.w)
    assert torch.allclose(out, x, atol=1e-6)


# ----------------------------------------------------------------------------- evaluation


def test_compare_settings_table(tiny):
    blocks = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))
    rows = evaluate.compare_settings(tiny, blocks, ["A8", "A4+STaMP", "A4+STaMP-dct+sink", "FP8-e4m3-mx"],
                                     batch_size=2, drift_blocks=1, progress=False)
    by = {r["setting"]: r for r in rows}
    assert list(by) == ["float", "A8", "A4+STaMP", "A4+STaMP-dct+sink", "FP8-e4m3-mx"]
    assert by["float"]["ppl"] == pytest.approx(evaluate.perplexity(tiny, blocks, progress=False), rel=1e-5)
    assert len(by["A8"]["drift_per_layer"]) == tiny.cfg.n_layers and by["A8"]["drift_mean"] > 0
    assert by["A8"]["drift_tokens_mean"] > 0 and len(by["A8"]["drift_tokens_per_layer"]) == tiny.cfg.n_layers
    assert by["A4+STaMP"]["mixes"] == "window" and not math.isnan(by["A4+STaMP"]["ppl_window_end"])
    assert math.isnan(by["A4+STaMP-dct+sink"]["ppl_window_end"])
    assert evaluate.window_end_positions(33).tolist() == [7, 15, 23, 31]
    assert evaluate.window_end_positions(33, sink_tokens=1).tolist() == [0, 8, 16, 24]


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call",
    [
        lambda: quant.minmax_quantize(torch.randn(2, 4), 0),
        lambda: quant.minmax_quantize(torch.randn(2, 4), 17),
        lambda: quant.minmax_quantize(torch.randn(2, 4), 3.5),
        lambda: quant.minmax_quantize(torch.randn(2, 4), torch.tensor([[4], [40]])),
        lambda: quant.sequence_transform(torch.randn(5, 4), "fourier"),
        lambda: quant.sequence_transform(torch.randn(12, 4), "wht"),
        lambda: quant.stamp_quantize(torch.randn(8, 4), levels=0),
        lambda: quant.fp8_round(torch.randn(3), "e3m4"),
        lambda: quant.fp8_quantize(torch.randn(3, 4), scaling="row"),
        lambda: quant.rtn_weight(torch.randn(3, 4), 4, group_size=0),
        lambda: evaluate.resolve_setting("A3"),
        lambda: evaluate.resolve_setting({"name": "x", "bits": 4}),
    ],
)
def test_bad_input_raises_one_line_error(call):
    with pytest.raises(WorkbenchError) as info:
        call()
    assert "\n" not in str(info.value)


def test_bad_hook_arguments_raise(tiny):
    with pytest.raises(WorkbenchError, match="out of range"):
        quant.stamp_hooks(tiny, bits=20)
    with pytest.raises(WorkbenchError, match="Unknown transform"):
        quant.stamp_hooks(tiny, transform="wavelet")
    with pytest.raises(WorkbenchError, match="do not exist"):
        quant.rtn_activation_hooks(tiny, layers=[9])
    with pytest.raises(WorkbenchError, match="Unknown sites"):
        quant.fp8_hooks(tiny, sites=["qkv"])
    blocks = torch.randint(0, 256, (1, 12))
    with pytest.raises(WorkbenchError, match="power-of-two"), evaluate.apply_setting(tiny, "A4+STaMP-wht"):
        tiny(blocks)


def test_run_quant_eval_writes_results(tmp_path):
    import json

    (tmp_path / "text.txt").write_text("Plain words for a short test of the quantization study. " * 40)
    rows = run_quant_eval("tiny", ["A8", "A4+STaMP+sink"], out=tmp_path / "out", n_tokens=256,
                                   block_len=64, split="all", source=str(tmp_path / "text.txt"),
                                   drift_blocks=1, progress=False)
    assert [r["setting"] for r in rows] == ["float", "A8", "A4+STaMP+sink"]
    record = json.loads((tmp_path / "out" / "results.json").read_text())
    assert record["versions"]["torch"] and record["config"]["block_len"] == 64
    assert (tmp_path / "out" / "results.csv").read_text().count("\n") == 4
    assert (tmp_path / "out" / "figure.html").stat().st_size > 1000
    with pytest.raises(WorkbenchError, match="Unknown quantization setting"):
        run_quant_eval("tiny", ["A5"])


def test_topology_and_sae_drift_are_zero_for_float_and_grow_with_coarser_quantization(tiny):
    """The drift columns: float vs itself is exactly zero; 2-bit activations move PH and SAE more than 8-bit."""
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

    torch.manual_seed(0)
    sae = TopKSAE(TopKSAEConfig(d_in=tiny.cfg.d_model, d_sae=96, k=8,
                                metadata=SAEMetadata(hook_name="blocks.1.hook_resid_post", model_name="tiny")))
    with torch.no_grad():
        sae.W_dec.copy_(torch.randn(96, tiny.cfg.d_model))
        sae.W_enc.copy_(sae.W_dec.T.clone())
    blocks = torch.randint(1, 256, (2, 64), generator=torch.Generator().manual_seed(1))
    rows = evaluate.compare_settings(tiny, blocks, ["A8", {"name": "A2", "act": "int", "act_bits": 2}], drift_blocks=2,
                                     progress=False, topology_layers=[0, 1], topology_k=60, sae=sae)
    by = {r["setting"]: r for r in rows}
    assert by["float"]["ph_bottleneck_h1_mean"] < 1e-12 and by["float"]["sae_active_jaccard"] == 1
    assert by["float"]["sae_fvu"] == by["float"]["sae_fvu_ref"]
    assert len(by["A8"]["ph_bottleneck_h0_per_layer"]) == 2 and by["A8"]["ph_layers"] == [0, 1]
    assert 0 < by["A8"]["ph_bottleneck_h0_mean"] < by["A2"]["ph_bottleneck_h0_mean"]
    assert 1 > by["A8"]["sae_active_jaccard"] > by["A2"]["sae_active_jaccard"]
    from workbench.tools.drift import drift_figure, has_drift

    assert has_drift(rows)
    fig = drift_figure(rows, "setting", "drift")
    assert {t.name for t in fig.data} >= {"A2 H1", "SAE unexplained variance", "active-feature Jaccard"}
    from workbench.tools.drift import DriftMeter  # the key of cached rows sees the SAE's weights

    before = DriftMeter(tiny, [0, 1], 60, sae).fingerprint()
    assert before == DriftMeter(tiny, [0, 1], 60, sae).fingerprint() != DriftMeter(tiny, [0, 1], 60).fingerprint()
    with torch.no_grad():
        sae.W_dec.mul_(2)
    assert DriftMeter(tiny, [0, 1], 60, sae).fingerprint() != before


def test_compare_settings_resumes_from_its_finished_settings(tiny, tmp_path, monkeypatch):
    """Each finished setting is kept: a second run computes nothing it has, equal rows come back, a new setting
    or other tokens are computed, and a damaged entry is computed again."""
    calls = []
    nll = evaluate.token_nll
    monkeypatch.setattr(evaluate, "token_nll", lambda *a, **k: calls.append(k.get("desc")) or nll(*a, **k))
    blocks = torch.randint(1, 256, (2, 32), generator=torch.Generator().manual_seed(2))
    kwargs = dict(drift_blocks=1, progress=False, topology_layers=[1], topology_k=20, cache=tmp_path)
    first = evaluate.compare_settings(tiny, blocks, ["A8", "A4"], **kwargs)
    assert calls == ["float", "A8", "A4"]
    again = evaluate.compare_settings(tiny, blocks, ["A4", "A8", "FP8-e4m3-mx"], **kwargs)
    assert calls[3:] == ["FP8-e4m3-mx"]  # float, A8 and A4 read back
    by = {r["setting"]: r for r in again}
    import json

    for row in first:  # the same numbers, exactly (NaN included)
        plain = json.dumps(row, sort_keys=True, default=lambda o: o.item())
        assert json.dumps(by[row["setting"]], sort_keys=True) == plain
    assert by["FP8-e4m3-mx"]["float_ppl_window_end"] == first[0]["float_ppl_window_end"]
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    next(folder.glob("A8-*.json")).write_text("{not json")
    evaluate.compare_settings(tiny, blocks, ["A8"], **kwargs)
    assert calls[4:] == ["A8"]
    evaluate.compare_settings(tiny, blocks.flip(1), ["A8"], **kwargs)  # other tokens: another folder
    assert calls[5:] == ["float", "A8"] and len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2
    forwards = []
    streams = evaluate.site_activations
    monkeypatch.setattr(evaluate, "site_activations", lambda *a, **k: forwards.append(1) or streams(*a, **k))
    cached = evaluate.compare_settings(tiny, blocks, ["A8", "A4"], **kwargs)  # all cached: no model runs
    assert calls[7:] == [] and forwards == [] and [r["setting"] for r in cached] == ["float", "A8", "A4"]
