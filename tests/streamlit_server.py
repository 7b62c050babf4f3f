"""Start the real app (`streamlit run`) on a free loopback port for a test, and stop it afterwards."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def streamlit_app(main: str | Path, cwd: str | Path, env: dict, log_path: Path, startup_s: float = 90):
    """Yield (url, port) once the server answers its health check; fail with its log if it never does."""
    import pytest

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(main), "--server.port", str(port)],
                                cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + startup_s
            while True:
                try:
                    if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                        break
                except OSError:
                    if proc.poll() is not None or time.time() > deadline:
                        pytest.fail(f"streamlit did not start: {Path(log_path).read_text()[-2000:]}")
                    time.sleep(0.5)
            yield url, port
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
