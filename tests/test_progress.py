"""Progress bars: tqdm's own environment switches hold even where a caller passes ``disable=not progress``."""

import io

from workbench.progress import progress_bar


def test_tqdm_disable_silences_a_bar_the_caller_enabled(monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    out = io.StringIO()
    bar = progress_bar(range(3), disable=False, file=out, desc="x")
    assert bar.disable and list(bar) == [0, 1, 2] and out.getvalue() == ""


def test_without_it_the_bar_draws_and_disable_true_still_wins(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    shown, hidden = io.StringIO(), io.StringIO()
    assert list(progress_bar(range(3), disable=False, file=shown, desc="x")) == [0, 1, 2]
    assert "3/3" in shown.getvalue()
    assert list(progress_bar(range(3), disable=True, file=hidden)) == [0, 1, 2] and hidden.getvalue() == ""
