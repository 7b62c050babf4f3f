"""Where the user cache lives: ``WORKBENCH_CACHE`` first, else the platform's cache folder (XDG on Linux)."""

import sys

import pytest

from workbench.paths import cache_dir, cache_root


def test_workbench_cache_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "wb"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "wb" and cache_dir("models") == tmp_path / "wb" / "models"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG is the Linux convention")
def test_xdg_cache_home_is_honoured(monkeypatch, tmp_path):
    monkeypatch.delenv("WORKBENCH_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir("models") == tmp_path / "xdg" / "workbench" / "models" and (tmp_path / "xdg").is_dir()
