"""Ray for the workbench's engines: joined or started once for a block, with one line when it cannot be.

Study grids (``workbench study run --engine ray``) and captures (``--engine ray``) both come through
``ray_session``, so the install hint, the address check and the shutdown live in one place.
"""

from __future__ import annotations

import contextlib
import contextvars
import socket

from workbench.errors import WorkbenchError

ENGINES = ("local", "ray")  # where study jobs and captures run: this process, or a Ray cluster


def check_address(address: str | None, timeout_s: float = 3.0) -> None:
    """Refuse at once an address (``host:port`` or ``ray://host:port``) where nothing answers.

    Ray itself retries a dead address for about a minute before failing with a long traceback.
    """
    if address in (None, "", "auto", "local"):
        return
    host_port = address.removeprefix("ray://").rstrip("/")
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise WorkbenchError(f"Ray address {address!r} is not host:port (or ray://host:port, or auto)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise WorkbenchError(f"nothing answers at the Ray address {address} ({exc.strerror or exc}): start the "
                             "cluster (`ray start --head`) or leave --address out to run a local one") from None


@contextlib.contextmanager
def ray_session(address: str | None = None):
    """``ray``, initialised for the block (and shut down after, if this block started it)."""
    try:
        import ray
    except ImportError:
        raise WorkbenchError("the ray engine needs Ray: pip install 'workbench[ray]'") from None
    check_address(address)
    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        except ConnectionError as exc:
            raise WorkbenchError(f"could not join the Ray cluster at {address or 'auto'} ({exc}): start it, or leave "
                                 "--address out to run a local one") from None
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


_ENGINE: contextvars.ContextVar = contextvars.ContextVar("workbench_capture_engine", default=None)


@contextlib.contextmanager
def capture_engine(engine: str = "local", workers: int | None = None, address: str | None = None):
    """Within the block, captures that take no engine argument of their own run on this one (the detector's
    features: ``workbench detect --engine ray`` sets it around training and scoring)."""
    token = _ENGINE.set({"engine": engine, "workers": workers, "address": address})
    try:
        yield
    finally:
        _ENGINE.reset(token)


def current_engine() -> dict:
    """The engine ``capture_engine`` set for this block (local when none)."""
    return _ENGINE.get() or {"engine": "local", "workers": None, "address": None}
