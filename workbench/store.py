"""ActivationStore: activations as safetensors shards plus a JSON manifest, in a folder or at any fsspec URL.

A shard holds complete rows (one per prompt) for every captured site, and the
rows' labels and metadata in its header, so a shard is the unit of atomicity:
it is written under a temporary name, renamed (a single put on an object
store), and only then listed in the manifest (itself replaced atomically). A
crash therefore never leaves a row half-written, and resuming means skipping
the rows the manifest lists. Every shard's sha256 is in the manifest and
checked when the shard is read. A store has one writer at a time
(``ActivationStore.writing`` holds its lock); with several capture workers,
the workers write shards and one driver lists them (``commit_shard``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.errors import WorkbenchError
from workbench.io import exclusive, write_atomic

MANIFEST = "manifest.json"
FORMAT = "workbench.activations/1"
TOKEN_KEYS = ("token_ids", "offsets", "row_index")  # present when positions == "all"
PAYLOAD_MEMO_BYTES = 256 * 2**20  # verified shard bytes an open store keeps (ActivationStore._payload)
LOCK = ".lock"  # the lock file inside a store folder, held by its one writer (pid and host inside)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


class Location:
    """Where a store's files live: a local folder (fsync'd renames, a file lock) or an fsspec URL.

    ``file://`` URLs are local folders. Other schemes (``memory://``, ``s3://``, ``gs://``, ...) go
    through fsspec: a shard is one put (atomic on object stores), and the lock is an object created
    only if absent, so a writer that died leaves it behind (the refusal says which object to delete).
    """

    def __init__(self, path: str | Path):
        text = str(path)
        self.fs = None
        if "://" in text and not text.startswith("file://"):
            self.fs, self.root = _filesystem(text)
            self.path: Path | str = text.rstrip("/")
        else:
            self.path = Path(text.removeprefix("file://"))

    @property
    def remote(self) -> bool:
        return self.fs is not None

    def _key(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def __str__(self) -> str:
        return str(self.path)

    def read(self, name: str) -> bytes | None:
        """The file's bytes, or None if it is not there."""
        try:
            return self.fs.cat_file(self._key(name)) if self.remote else (self.path / name).read_bytes()
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return self.fs.exists(self._key(name)) if self.remote else (self.path / name).exists()

    def write(self, name: str, data: bytes) -> None:
        """Replace ``name`` with ``data``: readers (and a crash) see the old or the new file, never half."""
        if self.remote:
            self.fs.pipe_file(self._key(name), data)
            return

        def synced(tmp: Path) -> None:  # on disk before the rename, so a crash never lists a half-written shard
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())

        write_atomic(self.path / name, synced)

    def head(self, name: str, n: int) -> bytes:
        """The first ``n`` bytes of a file (a range read on object stores)."""
        if self.remote:
            return self.fs.cat_file(self._key(name), start=0, end=n)
        with open(self.path / name, "rb") as fh:
            return fh.read(n)

    def names(self) -> list[str]:
        """File names directly inside (hidden temporaries included)."""
        if not self.remote:
            return [p.name for p in self.path.iterdir()] if self.path.is_dir() else []
        try:
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return []

    def remove(self, name: str) -> None:
        if self.remote:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(self._key(name))
        else:
            (self.path / name).unlink(missing_ok=True)

    def make(self) -> None:
        if self.remote:
            self.fs.makedirs(self.root, exist_ok=True)
        else:
            self.path.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def lock(self, what: str, wait: bool = False):
        """One writer at a time: the local file lock (``workbench.io.exclusive``), or a create-if-absent object."""
        if not self.remote:
            with exclusive(self.path / LOCK, what, wait=wait):
                yield
            return
        import socket
        import time

        self.make()
        while True:
            try:
                with self.fs.open(self._key(LOCK), "xb") as fh:
                    fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
                break
            except FileExistsError:
                if not wait:
                    holder = (self.read(LOCK) or b"another process").decode(errors="replace").strip()
                    raise WorkbenchError(f"{what} is in use by {holder}: wait for it to finish, or, if no capture "
                                         f"is running, delete {self._key(LOCK)}") from None
                time.sleep(1.0)
        try:
            yield
        finally:
            self.remove(LOCK)


def _filesystem(url: str):
    """fsspec's filesystem for ``url``, or one line saying what to install."""
    import fsspec

    scheme = url.split("://", 1)[0]
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        raise WorkbenchError(f"{url}: the {scheme}:// filesystem is not installed ({exc}); install it, "
                             "or give a local folder") from None
    except ValueError:
        raise WorkbenchError(f"{url}: fsspec knows no {scheme}:// filesystem; use a local folder or a URL such "
                             "as s3://bucket/path, gs://bucket/path or memory://path") from None


@dataclass
class ShardData:
    tensors: dict  # site -> torch.Tensor (rows first); TOKEN_KEYS when positions == "all"
    rows: list[dict]  # one metadata dict per row (text, label, ...)


def _header(payload: bytes) -> tuple[dict, int]:
    """A shard's safetensors header and where its tensor data starts."""
    header_len = int.from_bytes(payload[:8], "little")
    return json.loads(payload[8 : 8 + header_len]), 8 + header_len


def _payload_rows(payload: bytes) -> list[dict]:
    """The rows' metadata from a shard's safetensors header."""
    return json.loads(_header(payload)[0].get("__metadata__", {}).get("rows", "[]"))


_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
           "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def _payload_tensors(payload: bytes, names: list[str]) -> dict:
    """Only the tensors ``names`` of a shard's bytes, each copied out of its slice (``safetensors.torch.load``
    decodes every site; a probe reads one site at a time)."""
    import torch

    header, start = _header(payload)
    out = {}
    for name in names:
        info = header[name]
        begin, end = (start + o for o in info["data_offsets"])
        dtype = getattr(torch, _DTYPES[info["dtype"]])
        flat = torch.frombuffer(bytearray(payload[begin:end]), dtype=dtype) if end > begin else torch.empty(0, dtype=dtype)
        out[name] = flat.reshape(info["shape"])
    return out


def shard_payload(tensors: dict, rows: list[dict]) -> bytes:
    """One shard's bytes: the tensors, with the rows' metadata in the safetensors header."""
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in tensors.items()},
                metadata={"rows": json.dumps(rows, ensure_ascii=False, default=str)})


class ActivationStore:
    """Captured activations in a folder or at an fsspec URL. Open an existing one, or create one through ``capture``."""

    def __init__(self, path: str | Path):
        self.location = Location(path)
        self.path = self.location.path
        self._payloads: OrderedDict = OrderedDict()  # (file, sha256) -> verified shard bytes (``_payload``)
        raw = self.location.read(MANIFEST)
        if raw is None:
            raise WorkbenchError(f"{self.path} is not an activation store (no {MANIFEST}): run `workbench capture` first")
        try:
            self.manifest = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise WorkbenchError(f"{self.path}/{MANIFEST} is corrupt ({exc}): delete the folder and capture again") from None
        if self.manifest.get("format") != FORMAT:
            raise WorkbenchError(f"{self.path} holds format {self.manifest.get('format')!r}, expected {FORMAT}")

    # ------------------------------------------------------------ creation

    @classmethod
    @contextlib.contextmanager
    def writing(cls, path: str | Path, header: dict, overwrite: bool = False, wait: bool = False):
        """``create_or_resume`` with the store's lock held for the block: one writer at a time.

        Two writers would interleave shards (a false "corrupt shard" later). A second one is refused at
        once with the holder's pid, or with ``wait`` waits and then resumes. Another capture's store is
        refused before the lock is touched, so a refused run writes nothing.
        """
        location = Location(path)
        if not location.remote and location.path.exists() and not location.path.is_dir():
            raise WorkbenchError(f"--out {location.path} is a file: give a folder path (or a URL) for the store")
        cls._resumable(location, header, overwrite)
        with location.lock(f"the activation store {location}", wait=wait):
            yield cls.create_or_resume(path, header, overwrite=overwrite)

    @classmethod
    def _resumable(cls, location: Location, header: dict, overwrite: bool) -> ActivationStore | None:
        """The store there if it holds this same capture; None if there is none (or it is overwritten)."""
        if overwrite or not location.exists(MANIFEST):
            return None
        store = cls(location.path)
        mismatched = [k for k in _IDENTITY_KEYS if store.manifest.get(k) != header.get(k)]
        if mismatched:
            key = mismatched[0]
            raise WorkbenchError(
                f"{location} holds another capture ({key}: {store.manifest.get(key)!r} vs {header.get(key)!r}): "
                "choose another --out or pass --overwrite"
            )
        return store

    @classmethod
    def create_or_resume(cls, path: str | Path, header: dict, overwrite: bool = False) -> ActivationStore:
        """Open ``path`` for writing: new, resumed (same header), or refused (another capture's store).

        The caller holds the store's lock (see ``writing``)."""
        location = Location(path)
        store = cls._resumable(location, header, overwrite)
        if store is not None:
            store.drop_unlisted()
            return store
        location.make()
        if overwrite:
            for name in location.names():
                if name.startswith("shard-"):
                    location.remove(name)
        manifest = {"format": FORMAT, **header, "shards": [], "complete": False, "truncated_rows": []}
        location.write(MANIFEST, _manifest_bytes(manifest))
        return cls(path)

    def drop_unlisted(self) -> None:
        """Remove shards the manifest does not list (a crash after the write, before the listing) and temporaries."""
        listed = {s["file"] for s in self.manifest["shards"]}
        for name in self.location.names():
            if (name.startswith("shard-") or (name.startswith(".shard-") and name.endswith(".tmp"))) \
                    and name not in listed:
                self.location.remove(name)

    def write_shard(self, index: int, tensors: dict, rows: list[dict]) -> dict:
        """Write shard ``index`` (not yet listed) and return its manifest entry; a capture worker's half of a shard."""
        name = shard_name(index)
        payload = shard_payload(tensors, rows)
        self._write(name, payload)
        return {"file": name, "sha256": hashlib.sha256(payload).hexdigest(), "bytes": len(payload),
                "n_rows": len(rows), "d": {s: list(tensors[s].shape[1:]) for s in self.sites}}

    def commit_shard(self, entry: dict, truncated: list[int] = ()) -> None:
        """List a written shard as the next rows in the manifest (replaced atomically); the driver's half. The first
        one also records each site's per-row shape (``d``)."""
        first = self.n_rows
        if entry["file"] != shard_name(len(self.manifest["shards"])):
            raise WorkbenchError(f"shard {entry['file']} is committed out of order in {self.path}")
        widths = self.manifest["d"] if all(v is not None for v in self.manifest["d"].values()) else entry["d"]
        manifest = {**self.manifest, "d": widths,
                    "shards": [*self.manifest["shards"], {"file": entry["file"], "rows": [first, first + entry["n_rows"]],
                                                          "sha256": entry["sha256"], "bytes": entry["bytes"]}],
                    "truncated_rows": [*self.manifest["truncated_rows"], *(first + i for i in truncated)]}
        self._write(MANIFEST, _manifest_bytes(manifest))
        self.manifest = manifest

    def _write(self, name: str, data: bytes) -> None:
        try:
            self.location.write(name, data)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise WorkbenchError(
                    f"disk full while writing {name} in {self.path}: {self.n_rows} rows are safe; "
                    "free space and re-run the same command to resume"
                ) from None
            raise

    def append_shard(self, tensors: dict, rows: list[dict], truncated: list[int] = ()) -> None:
        """Write one shard of complete rows, then list it in the manifest (in that order)."""
        self.commit_shard(self.write_shard(len(self.manifest["shards"]), tensors, rows), truncated)

    def mark_complete(self) -> None:
        self._write(MANIFEST, _manifest_bytes({**self.manifest, "complete": True}))
        self.manifest["complete"] = True

    # ------------------------------------------------------------- reading

    @property
    def n_rows(self) -> int:
        shards = self.manifest["shards"]
        return shards[-1]["rows"][1] if shards else 0

    @property
    def sites(self) -> list[str]:
        return list(self.manifest["sites"])

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    def _payload(self, index: int, fresh: bool = False) -> bytes:
        """Shard ``index``'s bytes, checked against the manifest's sha256 once per store object: analyses read every
        site of a store in turn, and re-reading and re-hashing one shard per site was most of a probe's I/O. The
        bytes are immutable and keyed by the manifest's hash; at most ``PAYLOAD_MEMO_BYTES`` are held."""
        entry = self.manifest["shards"][index]
        key = (entry["file"], entry["sha256"])
        memo = self._payloads
        if key in memo and not fresh:
            memo.move_to_end(key)
            return memo[key]
        payload = self.location.read(entry["file"])
        if payload is None:
            raise WorkbenchError(f"shard {entry['file']} of {self.path} is missing: capture again with --overwrite")
        if hashlib.sha256(payload).hexdigest() != entry["sha256"]:
            raise WorkbenchError(
                f"shard {entry['file']} of {self.path} is corrupt (sha256 mismatch): capture again with --overwrite"
            )
        memo[key] = payload
        while sum(len(b) for b in memo.values()) > PAYLOAD_MEMO_BYTES and len(memo) > 1:
            memo.popitem(last=False)
        return payload

    def read_shard(self, index: int, names: list[str] | None = None) -> ShardData:
        """One shard, its bytes checked against the manifest's sha256; fresh tensors on every call (``names``:
        only these tensors are decoded)."""
        from safetensors.torch import load

        payload = self._payload(index)
        tensors = load(payload) if names is None else _payload_tensors(payload, names)
        return ShardData(tensors=tensors, rows=_payload_rows(payload))

    def n_items(self, site: str) -> int:
        """Stored rows of ``site`` (tokens, for ``positions == "all"``), read from the shards' headers only."""
        if site not in self.sites:
            raise WorkbenchError(f"site {site!r} is not in this store; it has {', '.join(self.sites)}")
        total = 0
        for entry in self.manifest["shards"]:
            size = int.from_bytes(self.location.head(entry["file"], 8), "little")
            header = json.loads(self.location.head(entry["file"], 8 + size)[8:])
            total += header[site]["shape"][0]
        return total

    def iter_shards(self) -> Iterator[ShardData]:
        for index in range(len(self.manifest["shards"])):
            yield self.read_shard(index)

    def verify(self) -> None:
        """Read every shard from its file (not from memory); raises naming the first missing or corrupt shard."""
        for index in range(len(self.manifest["shards"])):
            self._payload(index, fresh=True)

    def rows(self) -> list[dict]:
        """Per-row metadata (text, label, and whatever the prompt file carried), in row order (no tensor decoded)."""
        return [row for index in range(len(self.manifest["shards"])) for row in _payload_rows(self._payload(index))]

    def labels(self, field: str = "label") -> np.ndarray:
        return np.array([row.get(field) for row in self.rows()])

    def get(self, site: str, label=None, field: str = "label", as_numpy: bool = False):
        """All rows of one site (optionally only rows whose ``field`` equals ``label``), as torch or numpy.

        For ``positions == "all"`` the result has one row per token; ``token_table()`` says which.
        """
        import torch

        if site not in self.sites:
            raise WorkbenchError(f"site {site!r} is not in this store; it has {', '.join(self.sites)}")
        parts = []
        for index in range(len(self.manifest["shards"])):
            payload = self._payload(index)
            tensors = _payload_tensors(payload, [site, *(["row_index"] if self.manifest["positions"] == "all" else [])])
            values = tensors[site]
            if label is not None:
                keep = torch.tensor([row.get(field) == label for row in _payload_rows(payload)], dtype=torch.bool)
                if self.manifest["positions"] == "all":  # one entry per token: map tokens to their rows
                    keep = keep[tensors["row_index"] - self.manifest["shards"][index]["rows"][0]]
                values = values[keep]
            parts.append(values)
        if not parts:
            raise WorkbenchError(f"{self.path} has no rows yet: run the capture (it resumes)")
        out = torch.cat(parts)
        return out.numpy() if as_numpy else out

    def token_table(self) -> dict:
        """For ``positions == "all"``: row index, token id and character offsets of every stored token."""
        import torch

        if self.manifest["positions"] != "all":
            raise WorkbenchError("token_table() needs a store captured with positions 'all'")
        shards = list(self.iter_shards())
        return {key: torch.cat([s.tensors[key] for s in shards]) for key in TOKEN_KEYS}


def store_exists(path: str | Path) -> bool:
    """Whether ``path`` (a folder or URL) holds a store's manifest."""
    return Location(path).exists(MANIFEST)


def _manifest_bytes(manifest: dict) -> bytes:
    return json.dumps(manifest, indent=1, default=str).encode()


_IDENTITY_KEYS = ("model", "weights_sha256", "model_dtype", "attention", "sites", "positions", "prompts_sha256", "dtype", "max_tokens",
                  "splices")
