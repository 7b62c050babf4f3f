"""An offline English + code text corpus, and fixed-length token blocks cut from it.

Text that is on every machine with the workbench: the docstrings and documentation files (.md, .rst,
.txt) of a fixed list of distributions that ``pip install workbench`` always brings
(``CORPUS_DISTRIBUTIONS``: torch, transformers, numpy, scipy, ...). ``build_corpus`` reads their files in
sorted order, keeps mostly-prose English (code examples inside docstrings stay), drops license files,
data files and exact duplicates, and splits documents into train / held-out by a hash of their path, so
a document never straddles the split. The result is cached as JSON lines in the user cache folder, keyed
by what it read: those distributions with their versions, and the filter settings. Installing an
unrelated package changes nothing; with the versions of ``constraints.txt`` every machine gets the same
corpus, and results record its fingerprint and distributions (``corpus_record``).

A user's own text (a .txt / .md / .jsonl file or a folder of them, or ``hf:NAME`` for a Hugging Face
dataset through ``datasets``) goes through the same split and blocking code via ``source=``.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.paths import cache_dir

log = logging.getLogger(__name__)

CORPUS_VERSION = 2  # 2: a fixed list of distributions, keyed by their versions (1: all of site-packages)
# Prose-rich distributions that `pip install workbench` always installs (core dependencies and theirs):
# about 37M characters. Extras and unrelated packages stay out, so installing them never moves the corpus.
CORPUS_DISTRIBUTIONS = (
    "huggingface-hub", "matplotlib", "networkx", "numpy", "pandas", "plotly", "scikit-learn", "scipy",
    "sympy", "torch", "transformer-lens", "transformers",
)
HELDOUT_PERCENT = 10
SPLITS = ("train", "heldout", "all")
DOC_SUFFIXES = (".md", ".rst", ".txt")
LOCAL_SUFFIXES = (".txt", ".md", ".jsonl")
MAX_FILE_BYTES = 1_000_000
MIN_DOCSTRING_CHARS = 120
_SKIP_NAME = re.compile(
    r"^(licen[cs]e|copying|notice|authors|contributors|patents|third[-_]party|requirements|"
    r"entry_points|top_level|dependency_links|sources|record|installer|wheel|vocab|merges)",
    re.IGNORECASE,
)
_SKIP_DIR = {"__pycache__", "tests", "test", "testing", "_vendor", "vendored", "node_modules"}
_STOPWORDS = frozenset({
    "the", "of", "and", "to", "a", "in", "is", "for", "that", "this", "with", "be", "as", "on", "it",
    "are", "by", "if", "or", "not", "an", "from", "you", "can", "which", "will", "when", "we", "use", "used",
})
_WORD = re.compile(r"[A-Za-z]{2,}")


# ----------------------------------------------------------------------------- filtering


def is_prose(text: str, min_chars: int = MIN_DOCSTRING_CHARS) -> bool:
    """Mostly English prose: long enough, mostly letters, and common English words present."""
    if len(text) < min_chars:
        return False
    nonspace = sum(1 for c in text if not c.isspace())
    letters = sum(1 for c in text if c.isalpha())
    if not nonspace or letters / nonspace < 0.6:
        return False
    words = _WORD.findall(text)
    if len(words) < 15:
        return False
    stop = sum(1 for w in words if w.lower() in _STOPWORDS)
    return stop / len(words) >= 0.12


def _normalize(text: str) -> str:
    return " ".join(text.split())


def _digest(text: str) -> str:
    return hashlib.sha256(_normalize(text).encode()).hexdigest()


def split_of(key: str) -> str:
    """``heldout`` for HELDOUT_PERCENT % of source keys (by SHA-256), else ``train``."""
    return "heldout" if int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 100 < HELDOUT_PERCENT else "train"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise WorkbenchError(f"Unknown split {split!r}: choose one of {', '.join(SPLITS)}.")


# ----------------------------------------------------------------------------- site-packages


def _skipped(parts: tuple[str, ...]) -> bool:
    """A metadata, cache or test folder anywhere on the path."""
    return any(d in _SKIP_DIR or d.endswith((".dist-info", ".egg-info")) for d in parts)


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    """``(key, path)`` of the files under ``root`` in a deterministic order, skipping metadata, caches and tests."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _skipped((d,)))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            yield path.relative_to(root).as_posix(), path


def installed_distributions(names: Iterable[str] | None = None) -> dict[str, str]:
    """``{name: version}`` of the corpus distributions (or ``names``) that are installed (a missing one is left out)."""
    found = {}
    for name in CORPUS_DISTRIBUTIONS if names is None else names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def distribution_files(names: Iterable[str] | None = None) -> list[tuple[str, Path]]:
    """``(key, path)`` of the installed files of these distributions (from their RECORD), sorted by key; the key
    is the path in site-packages. Files installed outside site-packages (scripts) are left out."""
    files = {}
    for name in installed_distributions(names):
        dist = importlib.metadata.distribution(name)
        for rel in dist.files or ():
            parts = rel.parts
            if ".." in parts or _skipped(parts[:-1]):
                continue
            files.setdefault(rel.as_posix(), Path(dist.locate_file(rel)))
    return sorted(files.items())


def docstrings(source: str) -> list[str]:
    """Module, class and function docstrings of Python source (cleaned, in file order)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return []
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, nodes):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append(inspect.cleandoc(doc))
    return out


def _read(path: Path) -> str | None:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _files(roots: Iterable[Path] | None) -> list[tuple[str, Path]]:
    """What a build reads: the corpus distributions' files, or every file under each folder of ``roots``."""
    if roots is None:
        return distribution_files()
    return [item for root in roots for item in _walk(Path(root))]


def site_documents(roots: Iterable[Path] | None = None, progress: bool = False) -> Iterator[tuple[str, str]]:
    """``(key, text)`` for each prose document of the corpus distributions (or of the package folders
    ``roots``), deduplicated.

    A .py file gives one document (its prose docstrings joined); a documentation file gives
    one document if it reads as prose. Keys are paths relative to their site-packages folder.
    """
    from workbench.progress import progress_bar

    seen: set[str] = set()
    for key, path in progress_bar(_files(roots), desc="corpus", unit="file", disable=not progress):
        if _SKIP_NAME.match(path.name):
            continue
        is_py = path.suffix == ".py"
        if not is_py and path.suffix.lower() not in DOC_SUFFIXES:
            continue
        text = _read(path)
        if not text:
            continue
        parts = [d for d in docstrings(text) if is_prose(d)] if is_py else ([text] if is_prose(text) else [])
        kept = []
        for part in parts:
            h = _digest(part)
            if h not in seen:
                seen.add(h)
                kept.append(part.strip())
        if kept:
            yield key, "\n\n".join(kept)


def _filters() -> dict:
    """The settings that decide what a build keeps (a change gives a new corpus)."""
    return {"version": CORPUS_VERSION, "heldout_percent": HELDOUT_PERCENT, "doc_suffixes": DOC_SUFFIXES,
            "max_file_bytes": MAX_FILE_BYTES, "min_docstring_chars": MIN_DOCSTRING_CHARS,
            "skip_name": _SKIP_NAME.pattern, "skip_dir": sorted(_SKIP_DIR), "stopwords": sorted(_STOPWORDS)}


def _fingerprint(roots: list[Path] | None, distributions: dict[str, str] | None = None) -> str:
    """The corpus distributions and their versions (``distributions``, default the installed ones), or the package
    folders' file names, sizes and mtimes."""
    if roots is None:
        read = {"distributions": installed_distributions() if distributions is None else distributions}
    else:
        read = {"roots": [[str(r), [(k, p.stat().st_size, p.stat().st_mtime_ns) for k, p in _walk(r)]] for r in roots]}
    blob = json.dumps({**_filters(), **read}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_corpus(roots: Iterable[Path] | None = None, force: bool = False, progress: bool = True) -> Path:
    """Build (once) and return the cache folder holding ``train.jsonl``, ``heldout.jsonl``, ``manifest.json``.

    ``roots``: folders of packages to read whole instead of the corpus distributions (tests, a user's own)."""
    from workbench.io import build_once

    roots = [Path(r).resolve() for r in roots] if roots is not None else None
    folder = cache_dir("corpus") / _fingerprint(roots)
    # one builder, in a temporary folder published whole; the others wait, then reuse its result
    return build_once(folder, lambda tmp: _build(roots, tmp, folder.name, progress),
                      lambda f: not force and _complete(f), f"the corpus {folder}")


def _complete(folder: Path) -> bool:
    """A finished build: the manifest is written last, and both splits it counts are there."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return all((folder / f"{s}.jsonl").exists() for s in manifest.get("documents", {}))


def _build(roots: list[Path] | None, folder: Path, fingerprint: str, progress: bool) -> None:
    """Write the splits and the manifest into ``folder`` (a fresh temporary one, published by the caller)."""
    log.info("building the text corpus in %s (once; a minute or two)", folder)
    counts = {"train": [0, 0], "heldout": [0, 0]}
    handles = {s: (folder / f"{s}.jsonl").open("w", encoding="utf-8") for s in counts}
    try:
        for key, text in site_documents(roots, progress=progress):
            s = split_of(key)
            handles[s].write(json.dumps({"source": key, "text": text}) + "\n")
            counts[s][0] += 1
            counts[s][1] += len(text)
    finally:
        for h in handles.values():
            h.close()
    (folder / "manifest.json").write_text(json.dumps({
        "version": CORPUS_VERSION,
        "fingerprint": fingerprint,
        **({"distributions": installed_distributions()} if roots is None else {"roots": [str(r) for r in roots]}),
        "heldout_percent": HELDOUT_PERCENT,
        "documents": {s: c[0] for s, c in counts.items()},
        "characters": {s: c[1] for s, c in counts.items()},
    }, indent=2))


def text_fingerprint(source: str | Path | None = None) -> str:
    """What the text of ``documents(..., source)`` depends on, for cache keys: the package corpus's
    fingerprint (its distributions and versions), a Hugging Face dataset's own content fingerprint, or a local
    source's path and each file's name, size and mtime (an edited file, a new key)."""
    if source is None:
        return "packages:" + _fingerprint(None)
    if _is_hf(source):
        return f"{source}:" + _hf_dataset(str(source))._fingerprint  # datasets' hash of the rows
    root = Path(source).expanduser().resolve()
    files = sorted(root.rglob("*")) if root.is_dir() else [root]
    stats = [(str(f.relative_to(root)) if root.is_dir() else f.name, f.stat().st_size, f.stat().st_mtime_ns)
             for f in files if f.is_file()]
    return "local:" + hashlib.sha256(json.dumps([str(root), stats]).encode()).hexdigest()[:16]


def corpus_record() -> dict:
    """What a result that read the package corpus records about it, without building it: the fingerprint
    (its cache key) and the distributions read, with their versions."""
    distributions = installed_distributions()
    return {"fingerprint": _fingerprint(None, distributions), "version": CORPUS_VERSION, "distributions": distributions}


def corpus_manifest(force: bool = False) -> dict:
    """The manifest of the package corpus of this environment (built if needed, or again with ``force``)."""
    return json.loads((build_corpus(force=force) / "manifest.json").read_text())


# ----------------------------------------------------------------------------- reading

HF_PREFIX = "hf:"


def _is_hf(source) -> bool:
    return source is not None and str(source).startswith(HF_PREFIX)


@functools.lru_cache(maxsize=4)
def _hf_dataset(spec: str):
    """The ``train`` split of the Hugging Face dataset ``hf:NAME`` (a hub name, cached or online, or a local
    folder of data files), loaded through ``datasets``."""
    from workbench.errors import require

    require("datasets")
    import datasets

    name = spec[len(HF_PREFIX):]
    try:
        data = datasets.load_dataset(name, split="train")
    except Exception as exc:  # datasets raises many types (hub, file, builder): one line for all of them
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise WorkbenchError(f"Could not load the Hugging Face dataset {name!r} ({type(exc).__name__}: {first[:200]}): "
                             "check the name, and that it is cached or the hub is reachable.") from None
    if "text" not in data.column_names:
        raise WorkbenchError(f"The Hugging Face dataset {name!r} has no 'text' column (it has "
                             f"{', '.join(data.column_names)}): pass a dataset with one.")
    return data


def local_documents(path: str | Path) -> Iterator[tuple[str, str]]:
    """``(key, text)`` from a .txt / .md file (one document), a .jsonl file (field ``text``), a folder, or a
    Hugging Face dataset ``hf:NAME`` (its ``text`` column; a row's key is its index)."""
    if _is_hf(path):
        for i, text in enumerate(_hf_dataset(str(path))["text"]):
            yield f"{path}:{i}", str(text)
        return
    path = Path(path).expanduser()
    if not path.exists():
        raise WorkbenchError(f"Text source {path} does not exist: pass a .txt/.md/.jsonl file, a folder, or "
                             "hf:NAME for a Hugging Face dataset.")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    files = [f for f in files if f.suffix.lower() in LOCAL_SUFFIXES]
    if not files:
        raise WorkbenchError(f"No .txt, .md or .jsonl files in {path}.")
    base = path.parent if path.is_file() else path
    for f in files:
        key = f.relative_to(base).as_posix()
        text = f.read_text(encoding="utf-8", errors="replace")
        if f.suffix.lower() != ".jsonl":
            yield key, text
            continue
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                doc = record["text"]
            except (ValueError, KeyError, TypeError):
                raise WorkbenchError(f"{f}:{i + 1} is not a JSON object with a 'text' field.") from None
            yield f"{key}:{i + 1}", str(doc)


def documents(split: str = "heldout", source: str | Path | None = None) -> list[str]:
    """The texts of one split of the package corpus, or of a local ``source``."""
    _check_split(split)
    if source is not None:
        return [t for k, t in local_documents(source) if split == "all" or split_of(k) == split]
    return [text for _, text in keyed_documents(split)]


def keyed_documents(split: str = "heldout") -> list[tuple[str, str]]:
    """``(key, text)`` of one split of the package corpus; the key is the file's path in site-packages, so a
    caller can tell which distribution wrote a document."""
    _check_split(split)
    folder = build_corpus()
    out = []
    for name in ["train", "heldout"] if split == "all" else [split]:
        with (folder / f"{name}.jsonl").open(encoding="utf-8") as fh:
            out.extend((record["source"], record["text"]) for record in map(json.loads, fh))
    return out


def _token_stream(tokenizer, texts: list[str], order: list[int], needed: int, chunk_chars: int = 20_000):
    """Token ids of documents in ``order``, separated by EOS, until ``needed`` ids are collected.

    Documents are text: a control-token string inside one (docs quote ``<|endoftext|>``) stays ordinary tokens.
    """
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for i in order:
        text = texts[i]
        for start in range(0, len(text), chunk_chars):
            ids.extend(tokenizer(text[start : start + chunk_chars], add_special_tokens=False,
                                 split_special_tokens=True)["input_ids"])
        if eos is not None:
            ids.append(eos)
        if len(ids) >= needed:
            break
    return ids


def token_blocks(tokenizer, n_tokens: int, block_len: int, split: str = "heldout", seed: int = 0,
                 source: str | Path | None = None, prepend_bos: bool = True):
    """``LongTensor[n_tokens // block_len, block_len]`` of consecutive corpus tokens.

    Documents are taken in a seeded random order and joined with EOS; each block starts
    with BOS when ``prepend_bos`` and the tokenizer has one (models expect it at position 0).
    """
    import torch

    _check_split(split)
    if block_len < 2 or n_tokens < block_len:
        raise WorkbenchError(
            f"Need block_len >= 2 and n_tokens >= block_len, got n_tokens={n_tokens}, block_len={block_len}."
        )
    n_blocks = n_tokens // block_len
    bos = tokenizer.bos_token_id if prepend_bos else None
    body = block_len - (bos is not None)
    texts = documents(split, source)
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
    ids = _token_stream(tokenizer, texts, order, n_blocks * body)
    if len(ids) < n_blocks * body:
        raise WorkbenchError(
            f"The {split!r} text holds {len(ids)} tokens, fewer than the {n_blocks * body} asked: "
            "ask for fewer tokens, or use split='all' or a larger source."
        )
    blocks = torch.tensor(ids[: n_blocks * body], dtype=torch.long).reshape(n_blocks, body)
    if bos is not None:
        blocks = torch.cat([torch.full((n_blocks, 1), bos, dtype=torch.long), blocks], dim=1)
    return blocks


def count_tokens(tokenizer, split: str = "all", source: str | Path | None = None) -> int:
    """How many tokens (without separators) a split holds under ``tokenizer``."""
    texts = documents(split, source)
    return len(_token_stream(tokenizer, texts, list(range(len(texts))), float("inf"))) - (
        len(texts) if tokenizer.eos_token_id is not None else 0
    )
