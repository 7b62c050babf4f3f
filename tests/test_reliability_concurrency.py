"""Issue 20: two processes at once on one store or cache entry, and caches that cannot lie.

Every race here is run with real processes (``subprocess``), released together by a "go" file once
each has imported what it needs, so they really contend for the lock instead of running one after
the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tests.cli_harness import assert_refused, run_cli
from workbench.errors import WorkbenchError
from workbench.io import holder_file

REPO = Path(__file__).resolve().parents[1]


def start(script: str, *args, env: dict | None = None) -> subprocess.Popen:
    """``python -c script args...`` in the repository, output captured."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], cwd=REPO,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def release_together(folder: Path, procs: list[subprocess.Popen], timeout: float = 180) -> None:
    """Wait until every process wrote ``ready-<pid>`` into ``folder``, then create ``folder/go``."""
    deadline = time.monotonic() + timeout
    while not all((folder / f"ready-{p.pid}").exists() for p in procs):
        dead = [p for p in procs if p.poll() is not None]
        assert not dead, f"a process died before the start: {dead[0].communicate()}"
        assert time.monotonic() < deadline, "processes did not get ready"
        time.sleep(0.05)
    (folder / "go").touch()


WAIT_FOR_GO = """
    import os, sys, time
    from pathlib import Path
    sync = Path(sys.argv[1])
    def ready_then_wait():
        (sync / f"ready-{os.getpid()}").touch()
        while not (sync / "go").exists():
            time.sleep(0.002)
"""


# ----------------------------------------------------------------------------- capture: one writer per store

CAPTURE = WAIT_FOR_GO + """
    from workbench.cli import main
    from workbench.models import load_model
    load_model("tiny", device="cpu")  # imports done before the race
    ready_then_wait()
    main(sys.argv[2:])
"""


def test_two_captures_on_one_out_one_is_refused_naming_the_holder(tmp_path, tiny):
    """Two captures on one --out with different batch sizes used to interleave shards (a false 'corrupt
    shard' later). Now the second is refused at once with one line naming the first one's pid."""
    from workbench.capture import capture, read_prompt_file
    from workbench.store import ActivationStore

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"text": f"prompt number {i} " * (1 + i % 5), "label": i % 2})
                                 for i in range(200)))
    out, sync = tmp_path / "store", tmp_path / "sync"
    sync.mkdir()
    procs = [start(CAPTURE, sync, "capture", "--model", "tiny", "--device", "cpu", "--prompts", prompts,
                   "--layers", "1", "--out", out, "--batch-size", batch, env={"WORKBENCH_CACHE": tmp_path / "c"})
             for batch in (1, 2)]
    release_together(sync, procs)
    results = [(p, *p.communicate(timeout=300)) for p in procs]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 2], [(p.returncode, err[-2000:]) for p, _, err in results]
    (winner, _, _), (_, _, err) = sorted(results, key=lambda r: r[0].returncode)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: the activation store") and f"pid {winner.pid} on " in lines[0], lines[0]
    store = ActivationStore(out)
    store.verify()  # no interleaved, "corrupt" shards
    fresh = capture(tiny, read_prompt_file(prompts), ["blocks.1.hook_resid_post"], tmp_path / "fresh",
                    batch_size=8, progress=False)
    assert store.complete and store.n_rows == 200
    assert torch.allclose(store.get("blocks.1.hook_resid_post"), fresh.get("blocks.1.hook_resid_post"), atol=1e-5)
    assert (out / ".lock").exists() and not holder_file(out / ".lock").exists()  # released: it names nobody


HOLD = """
    import sys, time
    from pathlib import Path
    from workbench.io import exclusive
    with exclusive(sys.argv[1], "the test lock"):
        Path(sys.argv[2]).touch()
        time.sleep(float(sys.argv[3]))
"""


def test_exclusive_fails_fast_naming_the_holder_or_waits_for_it(tmp_path):
    from workbench.io import exclusive

    lock, held = tmp_path / "x" / ".lock", tmp_path / "held"
    holder = start(HOLD, lock, held, 3)
    deadline = time.monotonic() + 60
    while not held.exists():
        assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()
        time.sleep(0.02)
    refused = pytest.raises(WorkbenchError, match=f"the store is in use by pid {holder.pid} on .*: wait")
    with refused as err, exclusive(lock, "the store", wait=False):
        pass
    assert "\n" not in str(err.value)
    assert f"pid {holder.pid}" in holder_file(lock).read_text()  # a refused one leaves the holder's name alone
    with exclusive(lock, "the store"):  # waits for the holder to finish
        assert holder.wait(timeout=30) == 0  # it finished before we got the lock
        assert holder_file(lock).read_text().startswith(f"pid {os.getpid()} on ")
    assert holder.returncode == 0 and not holder_file(lock).exists()


# ----------------------------------------------------------------------------- cache entries built once

BUILD_MODEL_CACHE = WAIT_FOR_GO + """
    import json
    from workbench.models import load_model
    from workbench.models.loading import _read_cache, _write_cache
    from workbench.io import build_once
    model = load_model("tiny", device="cpu")
    folder = Path(sys.argv[2])

    def build(tmp):
        with open(sync / "builds", "a") as fh:
            fh.write(f"{os.getpid()}\\n")
        time.sleep(1.0)  # a slow dequantization: the other process arrives meanwhile
        _write_cache(tmp, model, {"weights_sha256": "test", "gguf": "none", "spec": "tiny"})

    ready_then_wait()
    build_once(folder, build, lambda f: _read_cache(f) is not None, f"the model cache {folder}")
    loaded, info = _read_cache(folder)
    tokens = __import__("torch").tensor([[1, 2, 3, 4]])
    print(json.dumps({"same": bool((loaded(tokens) - model(tokens)).abs().max() < 1e-6), **info}))
"""


def test_two_first_loads_build_the_model_cache_once(tmp_path):
    """Two first loads into an empty cache shared one '.tmp' folder and one crashed (SafetensorError). The
    writer and reader of the dequantized-weights cache, as ``_load_gguf`` composes them, in two processes:
    one builds (in its own temporary folder), the other waits and uses what it published."""
    sync, folder = tmp_path / "sync", tmp_path / "cache" / "models" / "tiny-0123"
    sync.mkdir()
    procs = [start(BUILD_MODEL_CACHE, sync, folder) for _ in range(2)]
    release_together(sync, procs)
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    for out, _ in outputs:
        assert json.loads(out.strip().splitlines()[-1]) == {"same": True, "weights_sha256": "test", "cached": True}
    assert len((sync / "builds").read_text().split()) == 1
    assert sorted(p.name for p in folder.parent.iterdir()) == ["tiny-0123", "tiny-0123.lock"]  # no temporaries
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "meta.json", "model.safetensors", "tokenizer"]


WRITE_JSON = WAIT_FOR_GO + """
    from workbench.io import write_json_atomic
    ready_then_wait()
    for i in range(300):
        write_json_atomic(Path(sys.argv[2]), {"pid": os.getpid(), "i": i, "pad": "x" * 5000})
"""


def test_two_writers_of_one_json_file_never_clash(tmp_path):
    """A fixed 'NAME.tmp' made two writers rename each other's half-written file (or fail)."""
    sync, target = tmp_path / "sync", tmp_path / "out" / "results.json"
    sync.mkdir()
    procs = [start(WRITE_JSON, sync, target) for _ in range(2)]
    release_together(sync, procs)
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    assert json.loads(target.read_text())["i"] == 299
    assert [p.name for p in target.parent.iterdir()] == ["results.json"]  # no temporary left behind


BUILD_CORPUS = WAIT_FOR_GO + """
    from workbench.data import corpus
    ready_then_wait()
    print(corpus.build_corpus([Path(sys.argv[2])]))
"""


def test_two_corpus_builders_publish_one_complete_folder(tmp_path):
    site = tmp_path / "site"
    for i in range(30):
        (site / f"pkg{i}").mkdir(parents=True)
        (site / f"pkg{i}" / "README.md").write_text(
            f"This is the {i} readme of a package, and it is used to test that the corpus of the workbench is "
            "built once by one of the processes that ask for it at the same time, and then read by the other. "
            * 3)
    sync, cache = tmp_path / "sync", tmp_path / "cache"
    sync.mkdir()
    procs = [start(BUILD_CORPUS, sync, site, env={"WORKBENCH_CACHE": cache}) for _ in range(2)]
    release_together(sync, procs)
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    folders = {out.strip().splitlines()[-1] for out, _ in outputs}
    assert len(folders) == 1
    folder = Path(folders.pop())
    manifest = json.loads((folder / "manifest.json").read_text())
    assert sum(manifest["documents"].values()) == 30
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name, folder.name + ".lock"]


# ----------------------------------------------------------------------------- cache keys


def test_the_dequantized_weights_cache_key_follows_the_file_and_the_converters(tmp_path, monkeypatch):
    from workbench.models import loading
    from workbench.models.registry import resolve

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(100))
    spec = resolve("m", model_path=gguf)
    first = loading.gguf_cache_folder(spec, gguf)
    assert first == loading.gguf_cache_folder(spec, gguf) and first.name.startswith("m-")
    assert not first.exists()  # naming an entry creates nothing
    os.utime(gguf, ns=(1, 1))
    touched = loading.gguf_cache_folder(spec, gguf)
    gguf.write_bytes(b"GGUF" + bytes(101))
    os.utime(gguf, ns=(1, 1))
    resized = loading.gguf_cache_folder(spec, gguf)
    monkeypatch.setattr(loading, "_CACHE_FORMAT", loading._CACHE_FORMAT + 1)
    reformatted = loading.gguf_cache_folder(spec, gguf)
    assert len({first, touched, resized, reformatted}) == 4
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda p: "0.0.0-other" if p == "transformer-lens" else real(p))
    assert loading.gguf_cache_folder(spec, gguf) != reformatted  # another converter, another entry


def test_a_tokenizer_cache_entry_is_keyed_by_everything_it_saves(tmp_path, monkeypatch):
    """Keyed by the vocabulary alone, a tokenizer with another chat template got the cached one's."""
    from workbench.models.loading import _portable_tokenizer
    from workbench.models.tiny import byte_tokenizer

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    plain, chat = byte_tokenizer(), byte_tokenizer()
    plain.chat_template = "{{ messages[0]['content'] }}"
    chat.chat_template = "<|user|>{{ messages[0]['content'] }}"
    assert plain.get_vocab() == chat.get_vocab()
    assert _portable_tokenizer(plain).chat_template == plain.chat_template
    assert _portable_tokenizer(chat).chat_template == chat.chat_template
    assert _portable_tokenizer(chat).chat_template == chat.chat_template  # from the cache now
    entries = [p for p in (tmp_path / "cache" / "tokenizers").iterdir() if p.is_dir()]
    assert len(entries) == 2 and not any(p.name.startswith(".") for p in entries)


def _study(tmp_path, **fixed) -> Path:
    import yaml

    path = tmp_path / "study" / "config.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({"name": "keyed", "seed": 1, "job": "workbench.commands.study_jobs:cloud_topology",
                                    "grid": {"noise": [0.1]}, "fixed": {"n": 30, **fixed}}))
    return path


def test_a_study_job_is_recomputed_when_any_of_its_inputs_changes(tmp_path, monkeypatch):
    from workbench.commands.study import run_study

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    jobs = tmp_path / "jobs"

    def run(config):
        outcome = run_study(config, cache=jobs, progress=False)
        return outcome["jobs"][0]

    first = run(_study(tmp_path))
    assert first["params"] == {"seed": 1, "n": 30, "noise": 0.1}
    record = next(jobs.glob("*.json"))
    stamp = record.stat().st_mtime_ns
    assert run(_study(tmp_path)) == first and record.stat().st_mtime_ns == stamp  # cached
    changed = run(_study(tmp_path, n=31))  # a fixed parameter: another job
    assert changed["params"]["n"] == 31 and len(list(jobs.glob("*.json"))) == 2
    source = tmp_path / "text.txt"
    source.write_text("one")
    run(_study(tmp_path, source=str(source)))
    source.write_text("other text")  # a file a parameter names: its content changed
    run(_study(tmp_path, source=str(source)))
    assert len(list(jobs.glob("*.json"))) == 4
    # a record computed from other inputs (here: other code versions) is not served, even under its name
    saved = json.loads(record.read_text())
    saved["key"]["versions"]["numpy"] = "0.0.1"
    saved["result"] = {"h1_count": -1.0}
    record.write_text(json.dumps(saved))
    assert run(_study(tmp_path)) == first
    record.write_text("{truncated")  # damaged: recomputed, not a traceback
    assert run(_study(tmp_path)) == first


# ----------------------------------------------------------------------------- bad input: one line, nothing written


@pytest.fixture()
def env(tmp_path, monkeypatch):
    """A temporary user cache and a prompt file; returns (cache, prompts)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("WORKBENCH_CACHE", str(cache))
    cache.mkdir()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"text": "hello"}) + "\n")
    return cache, prompts


DEVICES = [("tpu", "unknown device 'tpu'"), ("cuda:x", "unknown device"), ("mps:0", "unknown device"),
           ("gpu", "unknown device"), ("", "unknown device")]
if not torch.cuda.is_available():
    DEVICES += [("cuda", "device cuda is not available here: use --device cpu or auto"), ("cuda:0", "not available")]
else:
    DEVICES += [(f"cuda:{torch.cuda.device_count()}", "not available here")]
if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
    DEVICES += [("mps", "device mps is not available here")]


@pytest.mark.parametrize(("device", "expect"), DEVICES)
def test_a_device_that_is_not_here_is_one_line(env, tmp_path, device, expect):
    cache, prompts = env
    assert_refused(["capture", "--model", "tiny", "--prompts", prompts, "--layers", "1", "--out", tmp_path / "s",
                    "--device", device], expect=expect, watch=(tmp_path,))


@pytest.mark.parametrize("dtype", ["float8", "int4", ""])
def test_an_unknown_dtype_is_one_line(env, tmp_path, dtype):
    cache, prompts = env
    assert_refused(["capture", "--model", "tiny", "--prompts", prompts, "--layers", "1", "--out", tmp_path / "s",
                    "--device", "cpu", "--dtype", dtype], expect="unknown dtype", watch=(tmp_path,))


@pytest.mark.parametrize(("content", "expect"), [
    (os.urandom(4096), "not a GGUF file"),
    (b"this is a text file that is named like a model\n", "not a GGUF file"),
    (b"", "not a GGUF file"),
])
def test_a_file_that_is_not_gguf_is_one_line(env, tmp_path, content, expect):
    cache, _ = env
    fake = tmp_path / "x.gguf"
    fake.write_bytes(content)
    assert_refused(["sites", "--model-path", fake], expect=expect, watch=(tmp_path,))


def test_a_truncated_gguf_is_one_line_and_leaves_no_cache_entry(env, tmp_path):
    cache, _ = env
    fake = tmp_path / "cut.gguf"
    fake.write_bytes(b"GGUF\x03\x00\x00\x00" + os.urandom(64))  # the magic, then garbage: fails in the reader
    line = assert_refused(["sites", "--model", "cut", "--model-path", fake], expect="could not read")
    assert "is it a complete, supported file" in line
    entries = list((cache / "models").iterdir())
    assert all(p.suffix == ".lock" and p.read_text() == "" for p in entries), entries  # only a released lock


STUDY_NAMES = ["..", ".", "", "a/b", "../../outside", "x\\y", 5]


@pytest.mark.parametrize("name", STUDY_NAMES, ids=repr)
def test_a_study_name_cannot_leave_the_cache(env, tmp_path, name):
    import yaml

    cache, _ = env
    config = tmp_path / "s" / "config.yaml"
    config.parent.mkdir()
    config.write_text(yaml.safe_dump({"name": name, "job": "workbench.commands.study_jobs:cloud_topology",
                                      "grid": {"noise": [0.1]}}))
    expect = "must be text" if not isinstance(name, str) else "study name"
    assert_refused(["study", "run", config], expect=expect, watch=(tmp_path,))


@pytest.mark.parametrize(("args", "body", "expect"), [
    (["--retries", "-1"], None, "retries must be a whole number >= 0"),
    (["--retries", "x"], None, "retries"),  # typer's own usage error
    (["--engine", "slurm"], None, "unknown engine"),
    (["--out", "FILE"], None, "is a file"),
    ([], "- just\n- a list\n", "is not a study config"),
    ([], "name: t\njob: workbench.commands.study_jobs:cloud_topology\ngrid: {noise: [0.1]}\nfixed: [1, 2]\n",
     "'fixed'"),
    ([], "7\n", "is not a study config"),
])
def test_bad_study_runs_are_one_line(env, tmp_path, args, body, expect):
    import yaml

    config = tmp_path / "s" / "config.yaml"
    config.parent.mkdir()
    config.write_text(body or yaml.safe_dump({"name": "t", "job": "workbench.commands.study_jobs:cloud_topology",
                                              "grid": {"noise": [0.1]}}))
    (tmp_path / "FILE").write_text("not a folder")
    args = [str(tmp_path / "FILE") if a == "FILE" else a for a in args]
    assert_refused(["study", "run", config, *args], expect=expect, watch=(tmp_path,))


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "/abs", "x\0y", "n" * 201, None, 3])
def test_every_cache_path_part_is_one_plain_name(env, name):
    from workbench.paths import cache_dir, safe_name

    cache, _ = env
    with pytest.raises(WorkbenchError) as err:
        cache_dir("saes", name)
    assert "\n" not in str(err.value) and "folder name" in str(err.value)
    with pytest.raises(WorkbenchError, match="SAE name"):
        safe_name(name, "SAE name")
    assert list(cache.iterdir()) == []  # refused before creating anything
    assert safe_name("my-run.v2_1") == "my-run.v2_1" and cache_dir("saes", "ok") == cache / "saes" / "ok"


def test_derived_model_names_and_a_corrupt_registry(env, tmp_path):
    from workbench.models.registry import register_derived

    cache, _ = env
    for bad in ("../escape", "a/b", ".."):
        with pytest.raises(WorkbenchError, match="derived model name"):
            register_derived(bad, "tiny", tmp_path / "w.safetensors")
    assert not (cache / "models" / "derived.json").exists()
    (cache / "models").mkdir(exist_ok=True)
    (cache / "models" / "derived.json").write_text("{broken")
    assert_refused(["sites", "--model", "not-a-model"], expect="derived-model registry", watch=(tmp_path,))


def test_capture_refused_for_another_capture_writes_nothing(env, tmp_path, tiny):
    """The store's identity is checked before its lock file is written: a refused run changes nothing."""
    from workbench.capture import capture

    cache, prompts = env
    capture(tiny, ["a", "b"], ["blocks.1.hook_resid_post"], tmp_path / "s", progress=False)
    assert (tmp_path / "s" / ".lock").exists()
    assert_refused(["capture", "--model", "tiny", "--device", "cpu", "--prompts", prompts, "--layers", "2",
                    "--out", tmp_path / "s"], expect="holds another capture", watch=(tmp_path,))
    code, out, err = run_cli(["capture", "--model", "tiny", "--device", "cpu", "--prompts", prompts, "--layers", "2",
                              "--out", tmp_path / "s", "--overwrite"])
    assert code == 0, err
