"""Read safetensors checkpoints one tensor at a time, straight into the dtype a model computes in.

Why not ``safetensors.torch.load_file`` or ``safe_open``: both map the file into memory, and every page a
conversion touches then counts as resident until the mapping goes, so a model briefly lives twice (once
as file pages, once as its own tensors). Here each tensor is read with plain ``readinto`` calls into
memory of its own, in chunks of rows when its dtype changes on the way, so a load holds the weights once
plus one chunk (``tests/test_models.py``; peaks measured in ``bench/bench_load_memory.py``).

The format is the documented one: an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range in the data that follows.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from workbench.errors import WorkbenchError

CHUNK_BYTES = 16 << 20  # the one buffer a converting read goes through (reused by every tensor of a checkpoint)
INDEX = "model.safetensors.index.json"


def _dtypes() -> dict:
    import torch

    return {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
            "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
            "BOOL": torch.bool}


def read_header(path: str | Path) -> dict:
    """``{name: {"dtype", "shape", "data_offsets"}}`` of a safetensors file (metadata left out)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            if size > 100 << 20:
                raise ValueError(f"header of {size} bytes")
            header = json.loads(fh.read(size))
    except (OSError, ValueError, struct.error) as exc:
        raise WorkbenchError(f"{path} is not a readable safetensors file ({exc}): re-create or re-download it") \
            from None
    header.pop("__metadata__", None)
    return {name: {**entry, "start": 8 + size} for name, entry in header.items()}


class Checkpoint:
    """The tensors of one safetensors file, or of a sharded checkpoint (a folder with ``model.safetensors.index.json``
    or ``*.safetensors`` files), each read on demand."""

    def __init__(self, files: list[Path]):
        if not files:
            raise WorkbenchError("no safetensors files to read")
        self.where: dict[str, tuple[Path, dict]] = {}
        self._buffers: dict = {}  # stored dtype -> the chunk buffer converting reads share
        for file in files:
            for name, entry in read_header(file).items():
                self.where[name] = (file, entry)

    @classmethod
    def from_folder(cls, folder: str | Path) -> Checkpoint | None:
        """The checkpoint in an HF model folder, or None when it has no safetensors weights."""
        folder = Path(folder)
        index = folder / INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            return cls(sorted({folder / f for f in weight_map.values()}))
        files = sorted(folder.glob("*.safetensors"))
        return cls(files) if files else None

    def keys(self) -> list[str]:
        return list(self.where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.where[name][1]["shape"])

    def read(self, name: str, dtype=None):
        """Tensor ``name`` in ``dtype`` (default: as stored), read without mapping the file; converted in chunks of
        rows, so only one chunk of the stored dtype is held besides the result."""
        import torch

        file, entry = self.where[name]
        stored = _dtypes().get(entry["dtype"])
        if stored is None:
            raise WorkbenchError(f"{file}: tensor {name} has dtype {entry['dtype']}, which the workbench does not read")
        shape = tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        out = torch.empty(shape, dtype=dtype or stored)
        if out.numel() * stored.itemsize != end - begin:
            raise WorkbenchError(f"{file}: tensor {name} has {end - begin} bytes for shape {list(shape)}: the file is "
                                 "damaged; re-create or re-download it")
        with open(file, "rb", buffering=0) as fh:
            fh.seek(entry["start"] + begin)
            if out.dtype == stored:
                _fill(fh, out)
            else:
                flat = out.view(-1)
                step = max(1, CHUNK_BYTES // stored.itemsize)
                buffer = self._buffers.get(stored)
                if buffer is None or len(buffer) < min(step, flat.numel()):
                    buffer = self._buffers[stored] = torch.empty(min(step, flat.numel()), dtype=stored)
                for i in range(0, flat.numel(), step):
                    part = buffer[: min(step, flat.numel() - i)]
                    _fill(fh, part)
                    flat[i : i + len(part)].copy_(part)
        return out


def _fill(fh, tensor) -> None:
    """Read exactly the bytes of a contiguous ``tensor`` from ``fh`` into it."""
    import torch

    view = memoryview(tensor.view(-1).view(torch.uint8).numpy()) if tensor.numel() else memoryview(b"")
    done = 0
    while done < len(view):
        n = fh.readinto(view[done:])
        if not n:
            raise WorkbenchError(f"{fh.name} ends early: the file is truncated; re-create or re-download it")
        done += n
