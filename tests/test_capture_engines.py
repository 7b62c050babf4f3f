"""Stores at fsspec URLs and captures on Ray workers: the same bytes as a local capture, or one clear line."""

from __future__ import annotations

import filecmp
import uuid

import numpy as np
import pytest
import torch

from tests.cli_harness import assert_refused, run_cli
from workbench.capture import capture
from workbench.errors import WorkbenchError
from workbench.store import LOCK, ActivationStore

SITES = ["blocks.1.hook_resid_post", "blocks.3.hook_resid_post"]


def make_prompts(n: int) -> list[dict]:
    return [{"text": "the cat sat on the mat " * (1 + i % 5) + f"#{i}", "label": i % 2, "id": i} for i in range(n)]


def memory_url() -> str:
    return f"memory://stores/{uuid.uuid4().hex}"


def test_a_store_at_a_url_holds_what_a_local_one_holds_and_resumes(tiny, tmp_path):
    prompts = make_prompts(11)
    local = capture(tiny, prompts, SITES, tmp_path / "s", positions="all", shard_rows=4, progress=False)
    url = memory_url()
    remote = capture(tiny, prompts[:8], SITES, url, positions="all", shard_rows=4, progress=False)
    assert remote.complete and remote.n_rows == 8
    with pytest.raises(WorkbenchError, match="holds another capture"):  # other prompts: not this store
        capture(tiny, prompts, SITES, url, positions="all", shard_rows=4, progress=False)
    # a crash after shard 1 was written but before it was listed: the resume redoes it, and lists rows once
    again = ActivationStore(url)
    again.manifest["shards"] = again.manifest["shards"][:1]
    again.manifest["complete"] = False
    again.location.write("manifest.json", __import__("json").dumps(again.manifest).encode())
    with pytest.raises(WorkbenchError, match="prompts_sha256"):
        capture(tiny, prompts, SITES, url, positions="all", shard_rows=4, progress=False)
    resumed = capture(tiny, prompts[:8], SITES, url, positions="all", shard_rows=4, progress=False)
    assert resumed.n_rows == 8 and [r["id"] for r in resumed.rows()] == list(range(8))
    full_url = memory_url()
    full = capture(tiny, prompts, SITES, full_url, positions="all", shard_rows=4, progress=False)
    for site in SITES:
        assert torch.equal(ActivationStore(full_url).get(site), local.get(site))
    assert [e["sha256"] for e in full.manifest["shards"]] == [e["sha256"] for e in local.manifest["shards"]]
    shard = full.manifest["shards"][1]["file"]
    full.location.write(shard, b"garbage")
    with pytest.raises(WorkbenchError, match=f"{shard}.*corrupt"):
        ActivationStore(full_url).verify()


def test_a_url_store_has_one_writer(tiny):
    url = memory_url()
    capture(tiny, make_prompts(3), SITES, url, progress=False)
    store = ActivationStore(url)
    with store.location.lock("the store"), pytest.raises(WorkbenchError, match=f"in use by pid .*delete .*{LOCK}"):
        capture(tiny, make_prompts(3), SITES, url, progress=False)
    assert not store.location.exists(LOCK)  # released


@pytest.mark.parametrize("url, message", [
    ("zzz://bucket/store", "fsspec knows no zzz:// filesystem"),
    ("s3://bucket/store", "the s3:// filesystem is not installed .*s3fs"),
])
def test_a_url_nothing_can_write_is_refused_in_one_line(tiny, tmp_path, url, message):
    pytest.importorskip("fsspec")
    if url.startswith("s3") and __import__("importlib").util.find_spec("s3fs"):
        pytest.skip("s3fs is installed here")
    with pytest.raises(WorkbenchError, match=message):
        capture(tiny, make_prompts(2), SITES, url, progress=False)


def test_ray_workers_fill_the_same_store_even_when_one_is_killed(tiny, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    prompts = make_prompts(30)
    capture(tiny, prompts, SITES, tmp_path / "local", positions="all", shard_rows=3, progress=False)
    marker = tmp_path / "killed"
    monkeypatch.setenv("WORKBENCH_CAPTURE_FAULT", f"4:{marker}")  # the worker that reaches shard 4 dies (SIGKILL)
    remote = capture(tiny, prompts, SITES, tmp_path / "ray", positions="all", shard_rows=3, progress=False,
                     engine="ray", workers=2)
    assert marker.exists(), "no worker was killed: the test did not test a retry"
    assert remote.complete and remote.n_rows == 30
    names = sorted(p.name for p in (tmp_path / "local").iterdir() if p.name.startswith(("shard-", "manifest")))
    assert len(names) == 11 and sorted(p.name for p in (tmp_path / "ray").iterdir()
                                       if not p.name.startswith(".")) == names
    for name in names:  # bit for bit, the manifest included
        assert filecmp.cmp(tmp_path / "local" / name, tmp_path / "ray" / name, shallow=False), name


def test_ray_engine_refusals_write_nothing(tiny, tmp_path):
    pytest.importorskip("ray")
    from tests.cli_harness import snapshot

    before = snapshot(tmp_path)
    for kwargs, message in [
        ({"engine": "spark"}, "unknown engine 'spark'"),
        ({"engine": "ray", "workers": 0}, "workers must be a whole number of at least 1"),
        ({"engine": "ray", "address": "127.0.0.1:1"}, "nothing answers at the Ray address 127.0.0.1:1"),
        ({"engine": "ray", "address": "nowhere"}, "not host:port"),
    ]:
        with pytest.raises(WorkbenchError, match=message):
            capture(tiny, make_prompts(2), SITES, tmp_path / "s", progress=False, **kwargs)
    with pytest.raises(WorkbenchError, match="memory:// store lives in one process"):
        capture(tiny, make_prompts(2), SITES, memory_url(), progress=False, engine="ray")
    assert snapshot(tmp_path) == before and not (tmp_path / "s").exists()


def test_cli_capture_to_a_url_and_its_refusals(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"text": "hello {i}", "label": {i % 2}}}\n' for i in range(4)))
    url = memory_url()
    code, out, err = run_cli(["capture", "--prompts", prompts, "--out", url, "--model", "tiny", "--layers", "1",
                              "--json"])
    assert code == 0, err
    assert ActivationStore(url).n_rows == 4
    assert_refused(["capture", "--prompts", prompts, "--out", tmp_path / "s", "--model", "tiny", "--layers", "1",
                    "--engine", "ray", "--address", "127.0.0.1:1"], "nothing answers at the Ray address",
                   watch=[tmp_path])
    (tmp_path / "file").write_text("x")
    assert_refused(["capture", "--prompts", prompts, "--out", tmp_path / "file", "--model", "tiny", "--layers", "1"],
                   "is a file", watch=[tmp_path])


def test_a_probe_captured_on_ray_workers_reports_what_a_local_one_does(tiny, tmp_path):
    pytest.importorskip("ray")
    from workbench.commands.probe import run_probe
    from workbench.probe import ProbeConfig

    config = ProbeConfig(model="tiny", n_pairs=24, k=10, K=4, n_parts=2, n_boot=20, n_perm=20, flow_samples=0,
                         layers=[1, 3], batch_size=8)
    local = run_probe(tiny, config, tmp_path / "local", progress=False)
    remote = run_probe(tiny, config, tmp_path / "ray", progress=False, engine="ray", workers=2)
    for layer in (1, 3):
        a, b = local.conditions["injection"].layers[layer], remote.conditions["injection"].layers[layer]
        assert a.g == b.g and a.auc_topology == b.auc_topology
    store = tmp_path / "ray" / "stores" / "injection"
    assert filecmp.cmp(tmp_path / "local" / "stores" / "injection" / "manifest.json", store / "manifest.json",
                       shallow=False)
    assert_refused(["probe", "--model", "tiny", "--quick", "--out", tmp_path / "p", "--engine", "ray",
                    "--address", "127.0.0.1:1"], "nothing answers at the Ray address", watch=[tmp_path])
    assert not (tmp_path / "p").exists()


def test_sae_collection_on_ray_workers_equals_a_local_one(tiny, tmp_path):
    pytest.importorskip("ray")
    from workbench.sae.train import collect_activations

    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"word{i % 37} and more words {i}." for i in range(600)))
    kwargs = dict(n_tokens=24 * 32, block_len=32, source=str(text), shard_blocks=5, dtype="float32", progress=False)
    local = collect_activations(tiny, SITES, tmp_path / "local", **kwargs)
    remote = collect_activations(tiny, SITES, tmp_path / "ray", engine="ray", workers=2, **kwargs)
    assert remote.complete and remote.manifest["shards"] == local.manifest["shards"]
    for entry in local.manifest["shards"]:
        assert filecmp.cmp(tmp_path / "local" / entry["file"], tmp_path / "ray" / entry["file"], shallow=False)
    with pytest.raises(WorkbenchError, match="time budget is for the local engine"):
        collect_activations(tiny, SITES, tmp_path / "other", engine="ray", time_budget_s=5, **kwargs)
    assert not (tmp_path / "other").exists()


def test_detector_features_on_ray_workers_equal_local_ones(tiny, tmp_path):
    pytest.importorskip("ray")
    from workbench.cluster import capture_engine
    from workbench.detect.features import activation_features
    from workbench.topology.prompt_views import TokenCloudBarcode

    records = [{"text": f"Summarize this.\n\nThe report {i} says {'sales rose and costs fell ' * (1 + i % 4)}.",
                "label": ["clean", "injected"][i % 2]} for i in range(24)]
    kwargs = dict(topology=TokenCloudBarcode(seed=0), tokens=8, batch_size=4, progress=False)
    local = activation_features(tiny, records, [1, 3], **kwargs)
    with capture_engine("ray", workers=2):
        remote = activation_features(tiny, records, [1, 3], **kwargs)
    assert set(local) == set(remote) >= {"last", "doc_mean", "doc_max", "delta", "doc_topology", "doc_tokens"}
    for view in local:  # the same batches on the replicas: the same numbers, bit for bit
        assert np.array_equal(local[view], remote[view]), view
    assert_refused(["detect", "--model", "tiny", "--train", "--engine", "ray", "--address", "127.0.0.1:1",
                    "--detector-dir", tmp_path / "d"], "nothing answers at the Ray address", watch=[tmp_path])
    assert not (tmp_path / "d").exists()
