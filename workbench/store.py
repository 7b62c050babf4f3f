"""ActivationStore: activations on disk as safetensors shards plus a JSON manifest.

A shard holds complete rows (one per prompt) for every captured site, and the
rows' labels and metadata in its header, so a shard is the unit of atomicity:
it is written to a temporary name, renamed, and only then listed in the
manifest (itself replaced atomically). A crash therefore never leaves a row
half-written, and resuming means skipping the rows the manifest lists.
Every shard's sha256 is in the manifest and checked when the shard is read.
A store has one writer at a time (``ActivationStore.writing`` holds its lock file).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.errors import WorkbenchError
from workbench.io import exclusive, write_json_atomic

MANIFEST = "manifest.json"
FORMAT = "workbench.activations/1"
TOKEN_KEYS = ("token_ids", "offsets", "row_index")  # present when positions == "all"
LOCK = ".lock"  # the lock file inside a store folder, held by its one writer (pid and host inside)


@dataclass
class ShardData:
    tensors: dict  # site -> torch.Tensor (rows first); TOKEN_KEYS when positions == "all"
    rows: list[dict]  # one metadata dict per row (text, label, ...)


class ActivationStore:
    """A folder of captured activations. Open an existing one, or create one through ``capture``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        manifest_path = self.path / MANIFEST
        if not manifest_path.exists():
            raise WorkbenchError(f"{self.path} is not an activation store (no {MANIFEST}): run `workbench capture` first")
        try:
            self.manifest = json.loads(manifest_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise WorkbenchError(f"{manifest_path} is corrupt ({exc}): delete the folder and capture again") from None
        if self.manifest.get("format") != FORMAT:
            raise WorkbenchError(f"{self.path} holds format {self.manifest.get('format')!r}, expected {FORMAT}")

    # ------------------------------------------------------------ creation

    @classmethod
    @contextlib.contextmanager
    def writing(cls, path: str | Path, header: dict, overwrite: bool = False, wait: bool = False):
        """``create_or_resume`` with the store's lock held for the block: one writer at a time.

        Two writers would interleave shards (a false "corrupt shard" later). A second one is refused at
        once with the holder's pid, or with ``wait`` waits and then resumes. Another capture's store is
        refused before the lock file is touched, so a refused run writes nothing.
        """
        path = Path(path)
        cls._resumable(path, header, overwrite)
        with exclusive(path / LOCK, f"the activation store {path}", wait=wait):
            yield cls.create_or_resume(path, header, overwrite=overwrite)

    @classmethod
    def _resumable(cls, path: Path, header: dict, overwrite: bool) -> ActivationStore | None:
        """The store at ``path`` if it holds this same capture; None if there is none (or it is overwritten)."""
        if overwrite or not (path / MANIFEST).exists():
            return None
        store = cls(path)
        mismatched = [k for k in _IDENTITY_KEYS if store.manifest.get(k) != header.get(k)]
        if mismatched:
            key = mismatched[0]
            raise WorkbenchError(
                f"{path} holds another capture ({key}: {store.manifest.get(key)!r} vs {header.get(key)!r}): "
                "choose another --out or pass --overwrite"
            )
        return store

    @classmethod
    def create_or_resume(cls, path: str | Path, header: dict, overwrite: bool = False) -> ActivationStore:
        """Open ``path`` for writing: new, resumed (same header), or refused (another capture's store).

        The caller holds the store's lock (see ``writing``)."""
        path = Path(path)
        store = cls._resumable(path, header, overwrite)
        if store is not None:
            store._drop_orphans()
            return store
        path.mkdir(parents=True, exist_ok=True)
        manifest_path = path / MANIFEST
        if overwrite:
            for old in path.glob("shard-*.safetensors*"):
                old.unlink()
        write_json_atomic(manifest_path, {"format": FORMAT, **header, "shards": [], "complete": False,
                                          "truncated_rows": []})
        return cls(path)

    def _drop_orphans(self) -> None:
        listed = {s["file"] for s in self.manifest["shards"]}
        for file in self.path.glob("shard-*"):
            if file.name not in listed:
                file.unlink()

    def append_shard(self, tensors: dict, rows: list[dict], truncated: list[int] = ()) -> None:
        """Write one shard of complete rows, then list it in the manifest (in that order)."""
        from safetensors.torch import save

        index = len(self.manifest["shards"])
        name = f"shard-{index:05d}.safetensors"
        payload = save({k: v.contiguous() for k, v in tensors.items()},
                       metadata={"rows": json.dumps(rows, ensure_ascii=False, default=str)})
        tmp = self.path / (name + ".tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path / name)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno == errno.ENOSPC:
                raise WorkbenchError(
                    f"disk full while writing {name} in {self.path}: {self.n_rows} rows are safe; "
                    "free space and re-run the same command to resume"
                ) from None
            raise
        first = self.n_rows
        self.manifest["shards"].append({
            "file": name,
            "rows": [first, first + len(rows)],
            "sha256": hashlib.sha256(payload).hexdigest(),
            "bytes": len(payload),
        })
        self.manifest["truncated_rows"].extend(first + i for i in truncated)
        write_json_atomic(self.path / MANIFEST, self.manifest)

    def mark_complete(self) -> None:
        self.manifest["complete"] = True
        write_json_atomic(self.path / MANIFEST, self.manifest)

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

    def read_shard(self, index: int) -> ShardData:
        """One shard, its bytes checked against the manifest's sha256."""
        from safetensors.torch import load

        entry = self.manifest["shards"][index]
        file = self.path / entry["file"]
        if not file.exists():
            raise WorkbenchError(f"shard {entry['file']} of {self.path} is missing: capture again with --overwrite")
        payload = file.read_bytes()
        if hashlib.sha256(payload).hexdigest() != entry["sha256"]:
            raise WorkbenchError(
                f"shard {entry['file']} of {self.path} is corrupt (sha256 mismatch): capture again with --overwrite"
            )
        tensors = load(payload)
        header_len = int.from_bytes(payload[:8], "little")
        meta = json.loads(payload[8 : 8 + header_len]).get("__metadata__", {})
        return ShardData(tensors=tensors, rows=json.loads(meta.get("rows", "[]")))

    def iter_shards(self) -> Iterator[ShardData]:
        for index in range(len(self.manifest["shards"])):
            yield self.read_shard(index)

    def verify(self) -> None:
        """Read every shard once; raises naming the first missing or corrupt shard."""
        for _ in self.iter_shards():
            pass

    def rows(self) -> list[dict]:
        """Per-row metadata (text, label, and whatever the prompt file carried), in row order."""
        return [row for shard in self.iter_shards() for row in shard.rows]

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
        for index, shard in enumerate(self.iter_shards()):
            values = shard.tensors[site]
            if label is not None:
                keep = torch.tensor([row.get(field) == label for row in shard.rows], dtype=torch.bool)
                if self.manifest["positions"] == "all":  # one entry per token: map tokens to their rows
                    keep = keep[shard.tensors["row_index"] - self.manifest["shards"][index]["rows"][0]]
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


_IDENTITY_KEYS = ("model", "weights_sha256", "model_dtype", "attention", "sites", "positions", "prompts_sha256", "dtype", "max_tokens",
                  "splices")
