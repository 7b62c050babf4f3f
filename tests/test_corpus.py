"""Offline text corpus: filtering, dedupe, deterministic disjoint splits, token blocks, local sources."""

import json

import pytest
import torch

from workbench.data import corpus
from workbench.errors import WorkbenchError

PROSE = (
    "This function computes the mean of the values that are passed to it, and it is used by "
    "the rest of the package when a summary of the data is needed. {n} If the input is empty, "
    "an error is raised so that the caller can decide what to do with it."
)


@pytest.fixture()
def fake_site(tmp_path, monkeypatch):
    """A small site-packages folder with prose, code, a license and a duplicate."""
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "site-packages"
    for i in range(40):
        pkg = root / f"pkg{i:02d}"
        pkg.mkdir(parents=True)
        (pkg / "core.py").write_text(f'"""{PROSE.format(n=i)}"""\n\ndef f():\n    """x = 1"""\n    return 1\n')
        (pkg / "README.md").write_text(PROSE.format(n=f"readme {i}") * 2)
    (root / "pkg00" / "LICENSE.txt").write_text(PROSE.format(n="license"))
    (root / "pkg01" / "copy.py").write_text(f'"""{PROSE.format(n=0)}"""\n')  # duplicate of pkg00/core.py
    (root / "pkg02" / "table.txt").write_text("0 1 2 3 4 5 6 7 8 9\n" * 50)
    (root / "pkg03.dist-info").mkdir()
    (root / "pkg03.dist-info" / "METADATA.txt").write_text(PROSE.format(n="meta"))
    return root


def read_split(folder, split):
    return [json.loads(line) for line in (folder / f"{split}.jsonl").open()]


def test_filtering_and_dedupe(fake_site):
    docs = dict(corpus.site_documents([fake_site]))
    assert "pkg00/LICENSE.txt" not in docs
    assert "pkg01/copy.py" not in docs  # exact duplicate of pkg00/core.py
    assert "pkg02/table.txt" not in docs
    assert not any("dist-info" in k for k in docs)
    assert "pkg05/core.py" in docs and "x = 1" not in docs["pkg05/core.py"]
    assert len(docs) == 80


def test_corpus_deterministic_and_splits_disjoint(fake_site):
    a = corpus.build_corpus([fake_site])
    first = {s: (a / f"{s}.jsonl").read_text() for s in ("train", "heldout")}
    b = corpus.build_corpus([fake_site], force=True)
    assert a == b
    assert {s: (b / f"{s}.jsonl").read_text() for s in ("train", "heldout")} == first
    train = {r["source"] for r in read_split(b, "train")}
    held = {r["source"] for r in read_split(b, "heldout")}
    assert train and held and not train & held
    assert all(corpus.split_of(k) == "heldout" for k in held)
    manifest = json.loads((b / "manifest.json").read_text())
    assert manifest["documents"] == {"train": len(train), "heldout": len(held)}


def test_is_prose():
    assert corpus.is_prose(PROSE.format(n=""))
    assert not corpus.is_prose("x = torch.zeros(3, 4)\n" * 20)
    assert not corpus.is_prose("short text")


def test_token_blocks_from_local_folder(tmp_path):
    from workbench.models.tiny import byte_tokenizer

    tok = byte_tokenizer()
    (tmp_path / "a.txt").write_text(PROSE.format(n="a") * 5)
    (tmp_path / "b.md").write_text(PROSE.format(n="b") * 5)
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps({"text": PROSE.format(n=i)}) for i in range(20)))
    blocks = corpus.token_blocks(tok, 2000, 64, split="all", seed=0, source=tmp_path)
    assert blocks.shape == (31, 64) and blocks.dtype == torch.long
    assert (blocks[:, 0] == tok.bos_token_id).all()
    assert torch.equal(blocks, corpus.token_blocks(tok, 2000, 64, split="all", seed=0, source=tmp_path))
    assert not torch.equal(blocks, corpus.token_blocks(tok, 2000, 64, split="all", seed=1, source=tmp_path))
    nobos = corpus.token_blocks(tok, 640, 64, split="all", source=tmp_path, prepend_bos=False)
    assert nobos.shape == (10, 64) and (nobos != tok.bos_token_id).all()


def test_bad_input(tmp_path):
    from workbench.models.tiny import byte_tokenizer

    tok = byte_tokenizer()
    (tmp_path / "a.txt").write_text("hello world")
    (tmp_path / "bad.jsonl").write_text('{"content": 1}\n')
    with pytest.raises(WorkbenchError, match="fewer than"):
        corpus.token_blocks(tok, 4096, 64, split="all", source=tmp_path / "a.txt")
    with pytest.raises(WorkbenchError, match="'text' field"):
        corpus.token_blocks(tok, 64, 64, split="all", source=tmp_path / "bad.jsonl")
    with pytest.raises(WorkbenchError, match="does not exist"):
        corpus.token_blocks(tok, 64, 64, source=tmp_path / "missing")
    with pytest.raises(WorkbenchError, match="Unknown split"):
        corpus.token_blocks(tok, 64, 64, split="test", source=tmp_path)
    with pytest.raises(WorkbenchError, match="block_len"):
        corpus.token_blocks(tok, 10, 64, source=tmp_path)


@pytest.mark.slow
def test_installed_packages_give_two_million_tokens():
    """Walks the real site-packages (about a minute the first time, then cached)."""
    from workbench.models.tiny import byte_tokenizer

    manifest = json.loads((corpus.build_corpus() / "manifest.json").read_text())
    # bytes are an upper bound on BPE tokens; real tokenizers give ~4 chars per token
    assert sum(manifest["characters"].values()) > 4 * 2_000_000
    blocks = corpus.token_blocks(byte_tokenizer(), 4096, 512, split="heldout")
    assert blocks.shape == (8, 512)


def test_concurrent_builders_share_one_build_and_a_broken_one_is_redone(fake_site):
    """Builders in parallel threads wait on the lock and reuse the build; a half-written folder is rebuilt."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        folders = list(pool.map(lambda _: corpus.build_corpus([fake_site]), range(4)))
    assert len(set(folders)) == 1
    folder = folders[0]
    good = (folder / "train.jsonl").read_text()
    (folder / "train.jsonl").unlink()  # a crash or a cleaner removed one split: the manifest alone is not enough
    assert corpus.build_corpus([fake_site]) == folder and (folder / "train.jsonl").read_text() == good
    (folder / "manifest.json").write_text("{not json")
    assert corpus.build_corpus([fake_site]) == folder and json.loads((folder / "manifest.json").read_text())


def _fake_distribution(site, name, version, files):
    """A real installed-distribution layout (dist-info with METADATA and RECORD) that importlib.metadata finds."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in [*files, f"{info.name}/METADATA"]))
    return info


def test_corpus_reads_only_its_distributions_and_is_keyed_by_their_versions(tmp_path, monkeypatch):
    """Installing an unrelated package changes neither the key nor the text; a new version of a read one does."""
    import sys

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    site = tmp_path / "site"
    info = _fake_distribution(site, "wbfakedocs", "1.0", {
        f"wbfakedocs/m{i}.py": f'"""{PROSE.format(n=i)}"""\n' for i in range(30)} | {
        "wbfakedocs/tests/t.py": f'"""{PROSE.format(n="test")}"""\n', "../../bin/wbfake": "#!/bin/sh\n"})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(corpus, "CORPUS_DISTRIBUTIONS", ("wbfakedocs", "wb-not-installed"))
    assert corpus.installed_distributions() == {"wbfakedocs": "1.0"}
    assert [k for k, _ in corpus.distribution_files()] == sorted(f"wbfakedocs/m{i}.py" for i in range(30))  # no tests,
    # scripts outside site-packages, or metadata
    key = corpus.text_fingerprint()
    folder = corpus.build_corpus(progress=False)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["distributions"] == {"wbfakedocs": "1.0"} and sum(manifest["documents"].values()) == 30
    assert corpus.corpus_record() == {"fingerprint": folder.name, "version": corpus.CORPUS_VERSION,
                                      "distributions": {"wbfakedocs": "1.0"}}

    _fake_distribution(site, "wbunrelated", "2.0", {"wbunrelated/a.py": f'"""{PROSE.format(n="other")}"""\n'})
    assert corpus.text_fingerprint() == key and corpus.build_corpus(progress=False) == folder

    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: wbfakedocs\nVersion: 1.1\n")
    info.rename(site / "wbfakedocs-1.1.dist-info")
    sys.path_importer_cache.clear()
    assert corpus.text_fingerprint() != key


def test_hugging_face_dataset_source(tmp_path):
    """``hf:NAME`` goes through ``datasets`` (here a local folder of data files, as the hub's would be cached)."""
    pytest.importorskip("datasets")
    data = tmp_path / "ds"
    data.mkdir()
    rows = [PROSE.format(n=i) for i in range(50)]
    (data / "train.jsonl").write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(rows)))
    source = f"hf:{data}"
    assert [t for _, t in corpus.local_documents(source)] == rows
    held, train = corpus.documents("heldout", source), corpus.documents("train", source)
    assert sorted(held + train) == sorted(rows) and held and train
    assert corpus.text_fingerprint(source).startswith(source)
    (tmp_path / "notext").mkdir()
    (tmp_path / "notext" / "train.jsonl").write_text(json.dumps({"body": "x"}))
    with pytest.raises(WorkbenchError, match="no 'text' column"):
        corpus.documents("all", f"hf:{tmp_path / 'notext'}")
    with pytest.raises(WorkbenchError, match="Could not load the Hugging Face dataset"):
        corpus.documents("all", f"hf:{tmp_path / 'missing'}")


def test_corpus_command_describes_a_source(tmp_path):
    from typer.testing import CliRunner

    from workbench.cli import app

    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps({"text": PROSE.format(n=i)}) for i in range(40)))
    result = CliRunner().invoke(app, ["corpus", "--source", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert sum(out["documents"].values()) == 40 and out["fingerprint"].startswith("local:")
    missing = CliRunner().invoke(app, ["corpus", "--source", str(tmp_path / "nope")])
    assert isinstance(missing.exception, WorkbenchError) and "does not exist" in str(missing.exception)


def test_probe_folder_key_follows_the_corpus_only_where_the_prompts_read_it(monkeypatch):
    """The generator's documents come from the corpus, AgentDojo's and garak's do not."""
    from workbench.probe import ProbeConfig

    generated, agentdojo = ProbeConfig(conditions=("injection",)), ProbeConfig(conditions=("agentdojo",))
    before = generated.key(), agentdojo.key()
    monkeypatch.setattr(corpus, "CORPUS_DISTRIBUTIONS", ("numpy",))  # another corpus: another fingerprint
    assert generated.key() != before[0] and agentdojo.key() == before[1]
