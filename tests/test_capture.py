import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from workbench.capture import capture, read_prompt_file, resid_sites
from workbench.errors import WorkbenchError
from workbench.store import ActivationStore

SITES = ["blocks.1.hook_resid_post", "blocks.0.attn.hook_z"]


def make_prompts(n, seed=0):
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    out = []
    for i in range(n):
        body = " ".join(words[(i * 7 + j * (seed + 3)) % len(words)] for j in range(3 + (i * 5) % 11))
        text = f"Task {i}: {body}."
        out.append({"text": text, "label": "a" if i % 3 else "b", "id": i, "span": [0, 4]})
    return out


@pytest.mark.parametrize("positions", ["last", "mean", "span", "all"])
def test_batching_does_not_change_results(tiny, tmp_path, positions):
    prompts = make_prompts(13)
    one = capture(tiny, prompts, SITES, tmp_path / "b1", positions=positions, batch_size=1, progress=False)
    eight = capture(tiny, prompts, SITES, tmp_path / "b8", positions=positions, batch_size=8, progress=False)
    for site in SITES:
        assert torch.allclose(one.get(site), eight.get(site), atol=1e-5)
    assert one.get("blocks.0.attn.hook_z").shape[1:] == (tiny.cfg.n_heads, tiny.cfg.d_head)


def test_values_equal_an_unpadded_forward(tiny, tmp_path):
    prompts = make_prompts(6)
    last = capture(tiny, prompts, ["blocks.2.hook_resid_post"], tmp_path / "last", progress=False)
    mean = capture(tiny, prompts, ["blocks.2.hook_resid_post"], tmp_path / "mean", positions="mean", progress=False)
    span = capture(tiny, prompts, ["blocks.2.hook_resid_post"], tmp_path / "span", positions="span", progress=False)
    for i, prompt in enumerate(prompts):
        ids = [tiny.tokenizer.bos_token_id, *tiny.tokenizer(prompt["text"], add_special_tokens=False)["input_ids"]]
        _, cache = tiny.run_with_cache(torch.tensor([ids]), names_filter="blocks.2.hook_resid_post")
        acts = cache["blocks.2.hook_resid_post"][0]
        assert torch.allclose(last.get("blocks.2.hook_resid_post")[i], acts[-1], atol=1e-5)
        assert torch.allclose(mean.get("blocks.2.hook_resid_post")[i], acts.mean(0), atol=1e-5)
        # span [0, 4) = "Task" = four byte tokens after BOS
        assert torch.allclose(span.get("blocks.2.hook_resid_post")[i], acts[1:5].mean(0), atol=1e-5)


def test_all_positions_keep_tokens_and_offsets(tiny, tmp_path):
    prompts = make_prompts(5)
    store = capture(tiny, prompts, ["blocks.0.hook_resid_post"], tmp_path / "s", positions="all", progress=False,
                    shard_rows=2, batch_size=2)
    table = store.token_table()
    n_tokens = sum(len(p["text"].encode()) + 1 for p in prompts)  # byte tokens + BOS
    assert store.get("blocks.0.hook_resid_post").shape[0] == n_tokens == len(table["token_ids"])
    assert table["row_index"].tolist() == sorted(table["row_index"].tolist())
    assert set(table["row_index"].tolist()) == set(range(5))
    for r, prompt in enumerate(prompts):  # run shortest first within a shard, stored in file order
        ids = [tiny.tokenizer.bos_token_id, *tiny.tokenizer(prompt["text"], add_special_tokens=False)["input_ids"]]
        assert table["token_ids"][table["row_index"] == r].tolist() == ids
    assert store.get("blocks.0.hook_resid_post", label="b").shape[0] == sum(
        len(p["text"].encode()) + 1 for p in prompts if p["label"] == "b")


def test_forward_stops_after_deepest_site_and_leaves_no_hooks(tiny, tmp_path):
    calls = []
    handle = tiny.blocks[2].register_forward_hook(lambda *a: calls.append(1))
    try:
        capture(tiny, make_prompts(4), ["blocks.1.hook_resid_post"], tmp_path / "s", progress=False)
    finally:
        handle.remove()
    assert calls == []
    assert all(not hp.fwd_hooks for hp in tiny.hook_dict.values())


def test_manifest_and_reading(tiny, tmp_path):
    prompts = make_prompts(10)
    capture(tiny, prompts, SITES, tmp_path / "s", shard_rows=4, batch_size=2, progress=False)
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert m["model"] == "tiny" and len(m["weights_sha256"]) == 64 and m["complete"]
    assert [s["rows"] for s in m["shards"]] == [[0, 4], [4, 8], [8, 10]]
    assert all(len(s["sha256"]) == 64 for s in m["shards"])
    assert m["d"]["blocks.1.hook_resid_post"] == [tiny.cfg.d_model]
    reopened = ActivationStore(tmp_path / "s")
    assert [r["id"] for r in reopened.rows()] == list(range(10))
    assert reopened.get("blocks.1.hook_resid_post", label="b").shape == (4, tiny.cfg.d_model)
    assert reopened.get(SITES[0], as_numpy=True).dtype.name == "float32"
    assert list(reopened.labels()) == [p["label"] for p in prompts]
    with pytest.raises(WorkbenchError, match="not in this store"):
        reopened.get("blocks.3.hook_resid_post")


def test_capture_is_idempotent_and_refuses_another_capture(tiny, tmp_path):
    prompts = make_prompts(5)
    capture(tiny, prompts, SITES, tmp_path / "s", progress=False)
    again = capture(tiny, prompts, SITES, tmp_path / "s", progress=False)
    assert again.n_rows == 5
    with pytest.raises(WorkbenchError, match="holds another capture.*--overwrite"):
        capture(tiny, prompts, ["blocks.3.hook_resid_post"], tmp_path / "s", progress=False)
    replaced = capture(tiny, prompts, ["blocks.3.hook_resid_post"], tmp_path / "s", progress=False, overwrite=True)
    assert replaced.sites == ["blocks.3.hook_resid_post"]


def test_a_store_made_in_another_dtype_is_never_resumed_or_served(tmp_path):
    """The model's compute dtype is part of a store's identity: a bfloat16 run into a float32 store is refused, and
    a probe run in bfloat16 gets a folder of its own."""
    from workbench.models import load_model, model_identity
    from workbench.probe import ProbeConfig

    prompts = make_prompts(4)
    f32 = load_model("tiny", device="cpu")
    capture(f32, prompts, SITES, tmp_path / "s", progress=False)
    assert json.loads((tmp_path / "s" / "manifest.json").read_text())["model_dtype"] == "float32"
    bf16 = load_model("tiny", device="cpu", dtype="bfloat16")
    assert bf16.workbench["weights_sha256"] == f32.workbench["weights_sha256"]  # the same weights, cast
    with pytest.raises(WorkbenchError, match=r"holds another capture \(model_dtype: 'float32' vs 'bfloat16'\)"):
        capture(bf16, prompts, SITES, tmp_path / "s", progress=False)
    config = ProbeConfig(model="tiny")
    assert config.key(model_identity(f32)) != config.key(model_identity(bf16))


def test_corrupt_and_missing_shards_are_named(tiny, tmp_path):
    store = capture(tiny, make_prompts(6), SITES, tmp_path / "s", shard_rows=2, batch_size=2, progress=False)
    before = store.get(SITES[0])  # the verified bytes are now held in memory; verify() still reads the files
    shard = tmp_path / "s" / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(WorkbenchError, match="shard-00001.safetensors.*corrupt"):
        store.verify()
    assert torch.equal(store.get(SITES[0]), before)  # what this object verified, not the file changed under it
    (tmp_path / "s" / "shard-00002.safetensors").unlink()
    with pytest.raises(WorkbenchError, match="shard-00001"):
        ActivationStore(tmp_path / "s").get(SITES[0])
    shard.unlink()
    with pytest.raises(WorkbenchError, match="shard-00001.safetensors.*missing"):
        store.verify()
    (tmp_path / "s" / "manifest.json").write_text("{not json")
    with pytest.raises(WorkbenchError, match="manifest.json is corrupt"):
        ActivationStore(tmp_path / "s")


def test_disk_full_leaves_a_consistent_store_that_resumes(tiny, tmp_path, monkeypatch):
    import workbench.store as store_module

    prompts = make_prompts(9)
    real_fsync, writes = os.fsync, []

    def failing_fsync(fd):
        writes.append(fd)
        if len(writes) == 4:  # the new manifest, shard 0, its listing, then shard 1
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(store_module.os, "fsync", failing_fsync)
    with pytest.raises(WorkbenchError, match="disk full.*3 rows are safe"):
        capture(tiny, prompts, SITES, tmp_path / "s", shard_rows=3, batch_size=3, progress=False)
    partial = ActivationStore(tmp_path / "s")
    assert partial.n_rows == 3 and not partial.complete
    assert not list((tmp_path / "s").glob("*.tmp"))
    monkeypatch.setattr(store_module.os, "fsync", real_fsync)
    resumed = capture(tiny, prompts, SITES, tmp_path / "s", shard_rows=3, batch_size=3, progress=False)
    fresh = capture(tiny, prompts, SITES, tmp_path / "fresh", progress=False)
    assert torch.allclose(resumed.get(SITES[0]), fresh.get(SITES[0]), atol=1e-6)
    assert [r["id"] for r in resumed.rows()] == list(range(9))


KILL_SCRIPT = """
import json, sys
from workbench.models import load_model
from workbench.capture import capture
prompts = [json.loads(l) for l in open(sys.argv[1])]
capture(load_model("tiny", device="cpu"), prompts, ["blocks.1.hook_resid_post"], sys.argv[2],
        batch_size=2, shard_rows=4, progress=False)
"""


def test_killed_capture_resumes_without_loss_or_duplicates(tiny, tmp_path):
    prompts = make_prompts(400)
    prompt_file = tmp_path / "p.jsonl"
    prompt_file.write_text("\n".join(json.dumps(p) for p in prompts))
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(prompt_file), str(out)])
    deadline = time.time() + 120
    while time.time() < deadline:
        manifest = out / "manifest.json"
        if manifest.exists() and len(json.loads(manifest.read_text())["shards"]) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = ActivationStore(out)
    assert 0 < partial.n_rows < 400, "capture finished before it could be killed"
    resumed = capture(tiny, read_prompt_file(prompt_file), ["blocks.1.hook_resid_post"], out, batch_size=2,
                      shard_rows=4, progress=False)
    fresh = capture(tiny, prompts, ["blocks.1.hook_resid_post"], tmp_path / "fresh", batch_size=8, progress=False)
    assert [r["id"] for r in resumed.rows()] == list(range(400))
    assert torch.allclose(resumed.get("blocks.1.hook_resid_post"), fresh.get("blocks.1.hook_resid_post"), atol=1e-5)


def test_truncation_is_recorded(tiny, tmp_path, caplog):
    prompts = [{"text": "x" * 50}, {"text": "short"}, {"text": "y" * 80}]
    store = capture(tiny, prompts, ["blocks.0.hook_resid_post"], tmp_path / "s", max_tokens=20, progress=False)
    assert store.manifest["truncated_rows"] == [0, 2]
    assert "left-truncated" in caplog.text


@pytest.mark.parametrize("content, message", [
    (b"", "empty"),
    (b"\xff\xfe bad bytes\n", "not UTF-8"),
    (b'{"label": 1}\n', "no 'text'"),
    (b"not json\n", "not valid JSON"),
])
def test_bad_prompt_files(tmp_path, content, message):
    path = tmp_path / "p.jsonl"
    path.write_bytes(content)
    with pytest.raises(WorkbenchError, match=message):
        read_prompt_file(path)


def test_bad_sites_layers_and_options(tiny, tmp_path):
    with pytest.raises(WorkbenchError, match="did you mean blocks.1.hook_resid_post"):
        capture(tiny, ["hi"], ["blocks.1.hook_resid_pst"], tmp_path / "s")
    with pytest.raises(WorkbenchError, match="layer 9 is out of range.*0..3"):
        resid_sites(tiny, [9])
    with pytest.raises(WorkbenchError, match="no single position axis"):
        capture(tiny, ["hi"], ["blocks.0.attn.hook_pattern"], tmp_path / "s")
    with pytest.raises(WorkbenchError, match="unknown positions"):
        capture(tiny, ["hi"], SITES, tmp_path / "s", positions="first")
    with pytest.raises(WorkbenchError, match="needs a 'span'"):
        capture(tiny, ["hi"], SITES, tmp_path / "s", positions="span")
    with pytest.raises(WorkbenchError, match="no prompts"):
        capture(tiny, [], SITES, tmp_path / "s")
    with pytest.raises(WorkbenchError, match="empty 'text'"):
        capture(tiny, [""], SITES, tmp_path / "s")


@pytest.mark.slow
def test_real_model_batching_is_exact(smollm2, tmp_path):
    from workbench.conditions.injection import generate_injection_pairs

    prompts = generate_injection_pairs(5)
    sites = resid_sites(smollm2, [3, 15, 29])
    one = capture(smollm2, prompts, sites, tmp_path / "b1", batch_size=1, progress=False)
    eight = capture(smollm2, prompts, sites, tmp_path / "b8", batch_size=8, progress=False)
    for site in sites:
        a, b = one.get(site), eight.get(site)
        assert ((a - b).abs().max() / a.abs().max()).item() < 1e-5
