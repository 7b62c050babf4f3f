"""The functions behind `workbench sae train|features|interference|intervene`, end to end on the tiny model."""

import numpy as np
import pytest

from workbench.errors import WorkbenchError


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text")
    words = ["river", "bank", "money", "loan", "water", "fish", "door", "opened", "saw", "the"]
    rng = np.random.default_rng(1)
    for d in range(30):
        (folder / f"d{d}.txt").write_text(" ".join(" ".join(rng.choice(words, 8)) + "." for _ in range(30)))
    return folder


def test_run_functions_end_to_end(tiny, text, tmp_path, monkeypatch):
    from workbench.commands.sae import run_features, run_interference, run_intervene, run_train

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    res = run_train(tiny, "blocks.2.hook_resid_post", name="t", n_tokens=64 * 64, block_len=64, d_sae=128, k=8,
                    batch_size=256, train_tokens=8192, lr=2e-3, eval_tokens=128, source=str(text), progress=False)
    assert res["tokens_collected"] == 64 * 63 and res["tokens_trained"] == 8192
    assert set(res["metrics"]) >= {"l0", "explained_variance", "dead_fraction", "ce_recovered"}
    feats = run_features("t", tiny, progress=False)
    assert feats["n_described"] > 0
    inter = run_interference("t", tiny, k=8, min_interference=0.1)
    assert inter["n_pairs"] == 128 * 127 // 2 and abs(sum(inter["base_rates"]) - 1) < 1e-9
    f = feats["examples"][0]["feature"]
    out = run_intervene("t", "the river", "feature", f, 4.0, model=tiny)
    assert out["kl"] > 0 and len(out["after"]) == 10
    with pytest.raises(WorkbenchError):
        run_intervene("t", "the river", "feature", 10_000, 4.0, model=tiny)
    with pytest.raises(WorkbenchError):
        run_interference("no-such-sae", tiny)


def test_train_collects_into_and_streams_from_a_url_store(tiny, text, tmp_path, monkeypatch):
    from workbench.commands.sae import run_train
    from workbench.store import ActivationStore

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    url = "memory://acts/sae-test"
    kwargs = dict(n_tokens=32 * 64, block_len=64, d_sae=64, k=4, batch_size=128, train_tokens=1024, lr=2e-3,
                  eval_tokens=128, source=str(text), progress=False)
    res = run_train(tiny, "blocks.1.hook_resid_post", name="u", activations=url, **kwargs)
    store = ActivationStore(url)
    assert res["tokens_collected"] == 32 * 63 == store.n_items("blocks.1.hook_resid_post")
    assert store.n_items("blocks.1.hook_resid_post") == len(store.get("blocks.1.hook_resid_post"))
    assert res["tokens_trained"] == 1024 and store.complete


def test_collecting_with_a_bfloat16_copy_of_the_model(tiny, text, tmp_path, monkeypatch):
    from workbench.commands.sae import run_train
    from workbench.store import ActivationStore

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    kwargs = dict(n_tokens=16 * 64, block_len=64, d_sae=64, k=4, batch_size=128, train_tokens=512, lr=2e-3,
                  eval_tokens=128, source=str(text), progress=False)
    from workbench.sae.train import read_meta

    res = run_train(tiny, "blocks.1.hook_resid_post", name="b", collect_dtype="bfloat16", **kwargs)
    store = ActivationStore(read_meta(res["path"])["activations"])
    assert res["tokens_collected"] == 16 * 63 and store.manifest["model_dtype"] == "bfloat16"
    assert tiny.workbench["dtype"] == "float32"  # evaluated with the caller's model
    with pytest.raises(WorkbenchError, match="unknown dtype"):
        run_train(tiny, "blocks.1.hook_resid_post", name="c", collect_dtype="float8", **kwargs)


def test_a_reused_sae_keeps_its_metrics_until_an_input_changes(tiny, text, tmp_path, monkeypatch):
    import shutil

    import workbench.sae.train as train
    from workbench.commands.sae import run_train
    from workbench.data.corpus import token_blocks

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    calls = []
    evaluate = train.evaluate_sae
    monkeypatch.setattr(train, "evaluate_sae", lambda *a, **k: calls.append(1) or evaluate(*a, **k))
    kwargs = dict(n_tokens=16 * 64, block_len=64, d_sae=64, k=4, batch_size=128, train_tokens=512, lr=2e-3,
                  source=str(text), progress=False)
    first = run_train(tiny, "blocks.1.hook_resid_post", name="r", eval_tokens=128, **kwargs)
    again = run_train(tiny, "blocks.1.hook_resid_post", name="r", eval_tokens=128, **kwargs)
    assert len(calls) == 1 and again["metrics"] == first["metrics"]  # the same SAE, model and tokens: reused
    other = run_train(tiny, "blocks.1.hook_resid_post", name="r", eval_tokens=192, **kwargs)
    assert len(calls) == 2 and other["metrics"]["eval_tokens"] != first["metrics"]["eval_tokens"]
    # the key reads the SAE's own files: an edited config (or retrained weights) is evaluated afresh
    blocks = token_blocks(tiny.tokenizer, 128, 64, split="heldout", seed=0, source=str(text))
    copy = tmp_path / "copy"
    shutil.copytree(first["path"], copy)
    key = train.evaluation_key(tiny, copy, blocks, "blocks.1.hook_resid_post")
    assert key == train.evaluation_key(tiny, first["path"], blocks, "blocks.1.hook_resid_post")
    (copy / "cfg.json").write_text((copy / "cfg.json").read_text() + " ")
    assert key != train.evaluation_key(tiny, copy, blocks, "blocks.1.hook_resid_post")
    assert key != train.evaluation_key(tiny, first["path"], blocks[:1], "blocks.1.hook_resid_post")
