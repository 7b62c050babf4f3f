"""SAE pipeline on the tiny model: collect, train (TopK and standard), save/load, evaluate, describe, bad input.

Module-scoped fixtures train once; text comes from a generated local source so no corpus build runs.
"""

import json

import numpy as np
import pytest
import torch

from workbench.errors import WorkbenchError

SITE = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def text_source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text")
    words = ["river", "bank", "money", "loan", "water", "fish", "stream", "credit", "cash", "boat"]
    rng = np.random.default_rng(0)
    for d in range(40):
        sents = [" ".join(rng.choice(words, 8)) + "." for _ in range(30)]
        (folder / f"doc{d}.txt").write_text(" ".join(sents))
    return folder


@pytest.fixture(scope="module")
def store(tiny, text_source, tmp_path_factory):
    from workbench.sae.train import collect_activations

    out = tmp_path_factory.mktemp("acts")
    return collect_activations(tiny, [SITE], out, n_tokens=96 * 64, block_len=64, split="all",
                               source=text_source, batch_size=16, shard_blocks=32, progress=False)


@pytest.fixture(scope="module")
def trained(store, tmp_path_factory):
    from workbench.sae.train import TrainConfig, store_batches, train_sae

    out = tmp_path_factory.mktemp("sae") / "topk"
    cfg = TrainConfig(site=SITE, architecture="topk", d_sae=128, k=8, n_tokens=30_000, batch_size=256,
                      lr=2e-3, n_checkpoints=2, model_name="tiny")
    sae = train_sae(cfg, store_batches(store, SITE, 256), 64, out, resume=False, progress=False)
    return sae, out, cfg


def _mse(sae, x):
    import torch

    with torch.no_grad():
        return float((sae.decode(sae.encode(x)) - x).pow(2).sum(-1).mean())


def test_collect_skips_bos_and_keeps_tokens(store):
    x = store.get(SITE)
    table = store.token_table()
    assert x.shape == (96 * 63, 64)
    assert len(table["token_ids"]) == len(x)
    assert store.complete


def test_a_second_collector_waits_for_the_first(tiny, text_source, tmp_path):
    """Two writers on one store would delete each other's unfinished shards: the second waits, then resumes."""
    import threading
    import time

    from workbench.io import exclusive
    from workbench.sae.train import collect_activations

    out = tmp_path / "acts"
    result = {}

    def collect():
        result["store"] = collect_activations(tiny, [SITE], out, n_tokens=8 * 64, block_len=64, split="all",
                                              source=text_source, shard_blocks=4, progress=False)

    with exclusive(out / ".lock"):  # another process's collection, in effect
        worker = threading.Thread(target=collect)
        worker.start()
        time.sleep(1.0)
        assert worker.is_alive() and not (out / "manifest.json").exists()
    worker.join(timeout=60)
    assert result["store"].complete and result["store"].n_rows == 8


def test_store_dtype_follows_the_activations_range(tiny, store, text_source, tmp_path):
    """Massive activations (Gemma 3's reach ~6e4) would overflow float16 to inf: auto stores bfloat16, an
    explicit float16 store stops at once with a one-line error."""
    from workbench.sae.train import choose_store_dtype, collect_activations

    assert store.manifest["dtype"] == "float16"  # the tiny model's activations are small
    tokens = torch.randint(0, tiny.cfg.d_vocab, (2, 16))
    hook = ("blocks.1.hook_resid_post", lambda act, hook: act * 1e5)
    with tiny.hooks(fwd_hooks=[hook]):
        assert choose_store_dtype(tiny, [SITE], tokens) == "bfloat16"
        with pytest.raises(WorkbenchError, match="beyond float16's range.*bfloat16") as err:
            collect_activations(tiny, [SITE], tmp_path / "acts", n_tokens=4 * 64, block_len=64, split="all",
                                source=text_source, dtype="float16", progress=False)
    assert "\n" not in str(err.value)
    assert choose_store_dtype(tiny, [SITE], tokens) == "float16"


def test_topk_sae_trains_and_reduces_error(trained, store):
    from workbench.sae.train import TrainConfig, _training_sae

    sae, _, cfg = trained
    x = store.get(SITE).float()[:2000]
    fresh = _training_sae(TrainConfig(site=SITE, d_sae=128, k=8), 64)
    assert _mse(sae, x) < 0.5 * _mse(fresh, x)


def test_saved_sae_loads_with_saelens(trained):
    from sae_lens import SAE

    sae, out, _ = trained
    loaded = SAE.load_from_disk(str(out))
    assert loaded.cfg.metadata.hook_name == SITE
    assert loaded.cfg.d_sae == 128
    assert (out / "workbench.json").exists()
    assert any((out / "checkpoints").iterdir())


def test_standard_sae_trains_and_resumes(store, tmp_path):
    from workbench.sae.train import TrainConfig, store_batches, train_sae

    cfg = TrainConfig(site=SITE, architecture="standard", d_sae=128, l1_coefficient=1.0, n_tokens=10_240,
                      batch_size=256, lr=2e-3, n_checkpoints=1, model_name="tiny")
    sae = train_sae(cfg, store_batches(store, SITE, 256), 64, tmp_path, progress=False)
    x = store.get(SITE).float()[:1000]
    assert np.isfinite(_mse(sae, x))
    # a finished SAE is loaded, not retrained
    again = train_sae(cfg, store_batches(store, SITE, 256), 64, tmp_path, progress=False)
    assert torch.equal(again.W_dec, sae.W_dec)
    # without its record of completion, a call resumes from the checkpoint and finishes with the same token count
    (tmp_path / "workbench.json").unlink()
    resumed = train_sae(cfg, store_batches(store, SITE, 256), 64, tmp_path, progress=False)
    assert resumed.cfg.d_sae == 128 and json.loads((tmp_path / "workbench.json").read_text())["tokens_trained"] == 10_240
    # on the batches the uninterrupted run saw after its checkpoint (those of the norm estimate skipped too)
    torch.testing.assert_close(resumed.W_dec, sae.W_dec, rtol=1e-5, atol=1e-6)


def test_evaluate_sae_metrics(tiny, trained, text_source):
    from workbench.data.corpus import token_blocks
    from workbench.sae.train import evaluate_sae

    sae, _, _ = trained
    blocks = token_blocks(tiny.tokenizer, 4 * 64, 64, split="all", source=text_source)
    m = evaluate_sae(tiny, sae, blocks)
    assert m["l0"] <= 8 + 1e-6
    assert 0 <= m["dead_fraction"] <= 1
    assert m["explained_variance"] > 0.3
    assert np.isfinite(m["ce_recovered"])


def test_describe_features(tiny, trained, store):
    from workbench.sae.features import MARK, describe_features

    sae, _, _ = trained
    recs = describe_features(tiny, sae, store, features=[0, 1, 2], n_top=8, progress=False)
    assert [r["feature"] for r in recs] == [0, 1, 2]
    live = [r for r in recs if r["contexts"]]
    assert live, "no feature fired"
    r = live[0]
    assert MARK[0] in r["contexts"][0] and r["token_set"] and len(r["logit_lens"]) == 10
    assert r["top_activations"] == sorted(r["top_activations"], reverse=True)
    assert sum(r["histogram"]) > 0 and isinstance(r["description"], str)


def test_embed_texts_unit_norm_and_semantic():
    from workbench.sae.features import embed_texts

    E = embed_texts(["money in the bank", "cash and loans", "a cat sleeps on the sofa"])
    assert E.shape == (3, 384)
    assert np.allclose(np.linalg.norm(E, axis=1), 1, atol=1e-5)
    assert E[0] @ E[1] > E[0] @ E[2]


# ----------------------------------------------------------------------------- bad input


def test_bad_inputs_raise_one_line(tiny, trained, store, text_source, tmp_path):
    import torch

    from workbench.data.corpus import token_blocks
    from workbench.sae.features import check_feature
    from workbench.sae.load import load_sae
    from workbench.sae.train import check_site_matches, store_batches

    sae, out, _ = trained
    errors = []
    with pytest.raises(WorkbenchError) as e:  # d_in mismatch with the site
        check_site_matches(tiny, sae, "blocks.1.mlp.hook_post")
    errors.append(e)
    with pytest.raises(WorkbenchError) as e:
        check_feature(sae, 128)
    errors.append(e)
    with pytest.raises(WorkbenchError) as e:  # corpus too small
        token_blocks(tiny.tokenizer, 10**7, 64, split="all", source=text_source)
    errors.append(e)
    with pytest.raises(WorkbenchError) as e:  # unknown release, offline
        load_sae("no-such-release-v0", "blocks.0.hook_resid_post")
    errors.append(e)
    with pytest.raises(WorkbenchError) as e:  # known release, offline (no hub in tests)
        load_sae("gpt2-small-resid-post-v5-32k", "blocks.0.hook_resid_post")
    errors.append(e)
    # NaN activations
    from workbench.store import ActivationStore

    bad = ActivationStore.create_or_resume(tmp_path / "nan", {"model": "tiny", "sites": [SITE], "positions": "all",
                                                               "dtype": "float32", "d": {SITE: [64]}})
    x = torch.randn(10, 64)
    x[3, 5] = float("nan")
    bad.append_shard({SITE: x}, [{"block": 0}])
    with pytest.raises(WorkbenchError) as e:
        next(store_batches(bad, SITE, 4))
    errors.append(e)
    for e in errors:
        assert "\n" not in str(e.value) and str(e.value)


def test_load_sae_checks_model_site(tiny, trained):
    from workbench.sae.load import load_sae

    sae, out, _ = trained
    assert load_sae(out, model=tiny).cfg.d_sae == 128


def test_load_sae_names_a_bad_config_takes_the_site_and_fails_fast_offline(tiny, trained, tmp_path, monkeypatch):
    import shutil

    import workbench.models.loading as loading
    from workbench.sae.load import load_sae

    _, out, _ = trained
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    cfg = json.loads((bad / "cfg.json").read_text())
    (bad / "cfg.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "d_in"}))
    with pytest.raises(WorkbenchError, match=r"cfg.json is not a loadable SAELens SAE config \(") as e:
        load_sae(bad)
    assert "\n" not in str(e.value)
    # no hook recorded: the error says to pass the site, and passing it works
    plain = tmp_path / "plain"
    shutil.copytree(out, plain)
    cfg.setdefault("metadata", {})["hook_name"] = None
    cfg.pop("hook_name", None)
    (plain / "cfg.json").write_text(json.dumps(cfg))
    if load_sae(plain).cfg.metadata.hook_name is None:
        with pytest.raises(WorkbenchError, match="site="):
            load_sae(plain, model=tiny)
    sae = load_sae(plain, model=tiny, site=SITE)
    assert sae.cfg.metadata.hook_name == SITE
    with pytest.raises(WorkbenchError, match="blocks.9.hook_resid_post"):
        load_sae(plain, model=tiny, site="blocks.9.hook_resid_post")  # the tiny model has 4 layers
    # a known release with the hub unreachable: one line at once, no retries
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(WorkbenchError, match="not in the Hugging Face cache and the hub is unreachable"):
        load_sae("gpt2-small-resid-post-v5-32k", "blocks.0.hook_resid_post")


def _lopsided_batches(seed: int, batch: int = 256):
    """Endless batches of 32-d sparse codes over a random dictionary, plus two dimensions 300x larger that vary
    on their own: the shape of Gemma 3's residual (a few huge dimensions) in miniature."""
    gen = torch.Generator().manual_seed(seed)
    atoms = torch.nn.functional.normalize(torch.randn(96, 32, generator=torch.Generator().manual_seed(99)), dim=1)
    while True:
        codes = torch.rand(batch, 96, generator=gen) * (torch.rand(batch, 96, generator=gen) < 0.05)
        x = codes @ atoms
        x[:, :2] += 300 * (1 + 0.2 * torch.randn(batch, 2, generator=gen))
        yield x


def test_standardized_sae_reads_raw_inputs_and_keeps_the_small_dimensions(tmp_path):
    """normalize="standardize" (trained on (x - mean) / std), "whiten" (SAELens's PCA whitening) and "center"
    (x - mean, one scale) are saved folded (they read raw activations, SAELens config "none"). The first two
    reconstruct the small dimensions a "norm" SAE gives up for the two huge ones; "center", whose MSE is the
    explained-variance loss, explains the most variance (here by giving up the small dimensions: they hold 0.1%
    of it)."""
    from workbench.sae.train import TrainConfig, train_sae

    test = next(_lopsided_batches(7, 2048))
    per_dim, explained = {}, {}
    for normalize in ("norm", "standardize", "whiten", "center"):
        cfg = TrainConfig(site=SITE, d_sae=128, k=8, n_tokens=60_000, batch_size=256, lr=2e-3, n_checkpoints=0,
                          normalize=normalize)
        sae = train_sae(cfg, _lopsided_batches(0), 32, tmp_path / normalize, resume=False, progress=False)
        assert sae.cfg.normalize_activations == "none"  # folded: raw activations in, raw reconstructions out
        with torch.no_grad():
            error = (sae.decode(sae.encode(test)) - test).pow(2).sum(0)
        per_dim[normalize] = 1 - error / (test - test.mean(0)).pow(2).sum(0)
        explained[normalize] = float(1 - error.sum() / (test - test.mean(0)).pow(2).sum())
        assert json.loads((tmp_path / normalize / "workbench.json").read_text())["config"]["normalize"] == normalize
    small = slice(2, None)
    for normalize in ("standardize", "whiten"):
        assert per_dim[normalize][small].median() > per_dim["norm"][small].median() + 0.2
        assert per_dim[normalize][small].median() > 0.5
    assert explained["center"] > max(explained["norm"], explained["standardize"], explained["whiten"])


def test_sae_recorded_before_normalize_existed_is_reused_not_retrained(trained, store, tmp_path):
    import shutil

    from workbench.sae.train import TrainConfig, check_sae_folder, held_config, store_batches, train_sae

    _, out, cfg = trained
    old = tmp_path / "old"
    shutil.copytree(out, old)
    meta = json.loads((old / "workbench.json").read_text())
    del meta["config"]["normalize"]  # as every SAE trained before the option was written
    (old / "workbench.json").write_text(json.dumps(meta))
    weights = (old / "sae_weights.safetensors").stat().st_mtime_ns
    assert held_config(old)["normalize"] == "norm"
    check_sae_folder(old, {"normalize": "norm"})
    with pytest.raises(WorkbenchError, match="other settings"):
        check_sae_folder(old, {"normalize": "standardize"})
    train_sae(cfg, store_batches(store, SITE, 256), 64, old, progress=False)
    assert (old / "sae_weights.safetensors").stat().st_mtime_ns == weights
    with pytest.raises(WorkbenchError, match="--normalize 'zscore'"):
        TrainConfig(site=SITE, normalize="zscore")
