"""Files that are never half-written, and folders that two processes never build at once.

Every writer here builds its output under a unique temporary name beside the target and renames it into place
(readers see the old or the new file, never half of one); ``exclusive`` is the cross-process lock every store
and cache takes; ``build_once`` publishes a cache entry atomically under that lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from workbench.errors import WorkbenchError


def holder_file(lock_file: str | Path) -> Path:
    """Where the holder of ``lock_file`` writes its name (pid and host) while it holds the lock."""
    lock_file = Path(lock_file)
    return lock_file.with_name(lock_file.name + ".holder")


@contextlib.contextmanager
def exclusive(lock_file: str | Path, what: str = "it", wait: bool = True):
    """Hold an exclusive lock on ``lock_file`` (created if missing) for the block.

    Two writers on one store or cache folder would delete each other's unfinished files. With
    ``wait`` the second one waits for its turn (and then usually finds the work done); without it,
    it stops at once with one line naming the holder. The lock is ``filelock``'s (fcntl on POSIX,
    msvcrt on Windows); the holder's pid and host go to a separate file (``holder_file``) written
    after the lock is taken and removed before it is released, so a waiter can say who it waits for.
    """
    import logging
    import socket

    from filelock import FileLock, Timeout

    lock_file = Path(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_file), thread_local=False, preserve_lock_file=True)  # kept: no unlink race
    holder = holder_file(lock_file)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        name = _read_holder(holder)
        if not wait:
            raise WorkbenchError(f"{what} is in use by {name}: wait for it to finish, or use another folder") from None
        logging.getLogger(__name__).warning("%s is in use by %s: waiting for it", what, name)
        lock.acquire()
    try:
        write_text_atomic(holder, f"pid {os.getpid()} on {socket.gethostname()}\n")
        yield
    finally:
        holder.unlink(missing_ok=True)  # released: nobody holds it
        lock.release()


def _read_holder(holder: Path, patience_s: float = 2.0) -> str:
    """The holder's pid and host. It writes them just after taking the lock, so a refused process that comes in
    between waits up to ``patience_s`` for the file (none there after that: released, or a holder that died)."""
    import time

    deadline = time.monotonic() + patience_s
    while True:
        try:
            return holder.read_text().strip() or "another process"
        except OSError:
            if time.monotonic() >= deadline:
                return "another process"
            time.sleep(0.02)


def build_once(folder: str | Path, build, ready, what: str = "it") -> Path:
    """``folder`` (a cache entry), built at most once however many processes ask at the same time.

    When ``ready(folder)`` is false, ``build(tmp)`` fills a unique temporary folder beside it, which
    an atomic rename then publishes, all under a lock: the other processes wait, then find it ready.
    An entry that is there but not ready (stale, damaged) is replaced.
    """
    folder = Path(folder)
    if ready(folder):
        return folder
    with exclusive(folder.with_name(folder.name + ".lock"), what):
        if not ready(folder):
            tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
            try:
                build(tmp)
                _publish(tmp, folder)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _publish(tmp: Path, folder: Path) -> None:
    """Rename ``tmp`` to ``folder``; an old entry is first renamed aside, so readers never see half of one."""
    old = None
    if folder.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".old", dir=folder.parent))
        os.replace(folder, old)  # onto an empty folder: atomic
    os.replace(tmp, folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_output_folder(out) -> None:
    """An output folder (``--out``) that can be written: a path that is a file is refused before any work."""
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise WorkbenchError(f"--out {out} is a file: give a folder path")


def _temp_beside(path: Path) -> Path:
    """A temporary name beside ``path`` that no other writer uses (hidden, so globs of real files skip it)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")


def write_atomic(path: Path, write) -> None:
    """``write(tmp)`` a unique temporary file, then rename it over ``path``: readers see old or new, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) so that readers see the old or the new file, never half of one."""
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json_atomic(path: Path, obj) -> None:
    """Replace ``path`` with ``obj`` as JSON so that readers see the old or the new file, never half of one."""
    write_text_atomic(path, json.dumps(obj, indent=1, default=str))


def write_csv_atomic(path: Path, rows: list[dict]) -> None:
    """``rows`` as CSV (columns: every key, in first-seen order), replacing ``path`` atomically; no rows, no file."""
    import csv

    if not rows:
        return

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
            writer.writeheader()
            writer.writerows(rows)

    write_atomic(path, write)


def jsonl_text(records: list[dict]) -> str:
    """``records`` as JSON lines, exactly as ``write_jsonl`` writes them (so a saved file can be compared)."""
    return "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records)


def write_jsonl(records: list[dict], path: str | Path) -> Path:
    """``records`` as JSON lines (UTF-8, one object per line), replacing ``path`` atomically."""
    path = Path(path)
    write_text_atomic(path, jsonl_text(records))
    return path


class ItemCache:
    """The finished items of a long evaluation (a quantization setting, an attention method), one JSON file each in
    a folder named by a hash of every input the items depend on, so an interrupted run resumes at its first
    unfinished item and nothing computed under other inputs is ever served. Each file is written atomically; an
    unreadable one counts as missing (computed again). ``ItemCache.keyed(None, ...)`` keeps nothing."""

    def __init__(self, folder: Path | None):
        self.folder = folder

    @classmethod
    def keyed(cls, cache: str | Path | None, parts, *arrays) -> ItemCache:
        """The cache in ``cache`` for these inputs: JSON-able ``parts`` and the bytes of numpy-convertible ``arrays``."""
        if cache is None:
            return cls(None)
        import hashlib

        import numpy as np

        h = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
        for array in arrays:
            array = np.ascontiguousarray(array)
            h.update(f"{array.dtype}{array.shape}".encode())
            h.update(array.tobytes())
        return cls(Path(cache) / h.hexdigest()[:16])

    def _file(self, name: str, item) -> Path:
        import hashlib

        digest = hashlib.sha256(json.dumps(item, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return self.folder / f"{''.join(c if c.isalnum() or c in '+-_.' else '_' for c in name)}-{digest}.json"

    def get(self, name: str, item) -> dict | None:
        """The value kept for ``item`` (a JSON-able description; ``name`` names its file), or None."""
        file = None if self.folder is None else self._file(name, item)
        if file is None or not file.is_file():
            return None
        try:
            value = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def put(self, name: str, item, value: dict) -> None:
        """Keep ``value`` (numpy and torch values as plain numbers and lists; floats exactly, NaN included)."""
        if self.folder is None:
            return
        text = json.dumps(value, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
        write_text_atomic(self._file(name, item), text)
