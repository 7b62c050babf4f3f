"""The app's safety: it opens only the folders it was allowed, and it listens on the loopback interface only.

``allowed_path`` is the one policy (pure, unit-tested here); the AppTest cases show that a ``?run=`` link,
the folder box and the output-folder box all go through it, and that a refused one reads and writes nothing.
"""

import os
import socket
import sys
from pathlib import Path

import pytest

from tests.streamlit_server import streamlit_app

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from tests import test_app  # noqa: E402
from tests.test_app import MAIN, TIMEOUT  # noqa: E402
from workbench.errors import WorkbenchError  # noqa: E402

app_env, report_dir = test_app.app_env, test_app.report_dir  # the app tests' fixtures


# ----------------------------------------------------------------------------- the policy


def test_allowed_path_accepts_what_lies_inside_a_root(tmp_path):
    from wbapp.access import allowed_path

    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    assert allowed_path(root / "run", [root]) == (root / "run").resolve()
    assert allowed_path(root, [root]) == root.resolve()
    assert allowed_path(root / "not-yet" / "made", [tmp_path / "x", root]) == (root / "not-yet" / "made").resolve()


@pytest.mark.parametrize("where", ["/etc", "/", "sibling", "root/../sibling", "root/run/../../sibling", "",
                                   "root-suffix"])
def test_allowed_path_refuses_what_lies_outside(tmp_path, monkeypatch, where):
    from wbapp.access import allowed_path

    monkeypatch.chdir(tmp_path)  # "" and relative paths resolve against the working directory
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (tmp_path / "sibling").mkdir()
    (tmp_path / "root-suffix").mkdir()  # shares the root's name as a prefix, not as a folder
    with pytest.raises(WorkbenchError, match=r"outside the folders this app may open \(.*root\).*--allow"):
        allowed_path(where, [root])


def test_allowed_path_resolves_symlinks_before_checking(tmp_path):
    from wbapp.access import allowed_path

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    with pytest.raises(WorkbenchError, match="outside"):
        allowed_path(root / "escape", [root])
    with pytest.raises(WorkbenchError, match="outside"):
        allowed_path(root / "escape" / "deeper", [root])
    (tmp_path / "alias").symlink_to(root)  # a root given through a symlink still holds its own folders
    assert allowed_path(root / "x", [tmp_path / "alias"]) == (root / "x").resolve()


def test_allowed_path_refuses_unusable_paths_in_one_line(tmp_path):
    from wbapp.access import allowed_path

    with pytest.raises(WorkbenchError, match="not a usable path"):
        allowed_path("bad\0name", [tmp_path])
    with pytest.raises(WorkbenchError, match=r"\(none\)"):
        allowed_path(tmp_path, [])


def test_allow_folders_come_from_the_scripts_own_arguments(tmp_path):
    from wbapp.access import argv_folders

    assert argv_folders(["--allow", "/a", "--other", "x", "--allow=/b", "--allow", ""]) == [Path("/a"), Path("/b")]
    assert argv_folders(["--allow"]) == []  # a dangling flag adds nothing
    assert argv_folders(["-m", "pytest", "tests"]) == []


def test_app_roots_are_the_cache_studies_and_the_operators_folders(tmp_path, monkeypatch):
    from wbapp.access import EXAMPLES, REPO, app_roots

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WORKBENCH_APP_RUNS", f"{tmp_path / 'runs'}{os.pathsep}")
    monkeypatch.delenv("WORKBENCH_APP_RUN", raising=False)
    monkeypatch.delenv("WORKBENCH_APP_SAES", raising=False)
    monkeypatch.setattr(sys, "argv", [MAIN, "--allow", str(tmp_path / "given")])
    assert app_roots() == [tmp_path / "cache", REPO / "studies", EXAMPLES, tmp_path / "given", tmp_path / "runs"]


# ----------------------------------------------------------------------------- the app


def open_app(query: dict | None = None) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_a_run_link_outside_the_allowed_folders_is_refused(app_env):
    at = open_app({"run": "/etc"})
    assert len(at.error) == 1 and "/etc is outside the folders this app may open" in at.error[0].value
    assert str(app_env / "cache") in at.error[0].value  # it names the allowed roots
    assert "run_dir" not in at.session_state and not at.dataframe  # nothing selected, no report read
    at.switch_page("views/topology.py").run()
    assert not at.get("plotly_chart") and not at.exception


def test_a_run_link_that_climbs_out_with_dots_is_refused(app_env, report_dir):
    sneaky = f"{app_env / 'cache'}/../../../../../../etc"
    at = open_app({"run": sneaky})
    assert "outside" in at.error[0].value and not at.dataframe


def test_a_run_link_inside_the_allowed_folders_opens(app_env, report_dir):
    at = open_app({"run": str(report_dir)})
    assert not at.error and at.session_state["run_dir"] == str(report_dir.resolve())
    assert len(at.dataframe[0].value) == 3


@pytest.mark.parametrize("typed", ["/etc", "/etc/passwd", "~", "{cache}/../../.."])
def test_a_typed_folder_outside_is_refused(app_env, typed):
    at = open_app()
    at.text_input(key="runs_typed").input(typed.format(cache=app_env / "cache")).run()
    at.button(key="runs_open").click().run()
    assert len(at.error) == 1 and "outside the folders this app may open" in at.error[0].value
    assert "run_dir" not in at.session_state and not at.exception


def test_an_output_folder_outside_is_refused_and_not_created(app_env, tmp_path_factory):
    outside = tmp_path_factory.getbasetemp().parent / f"workbench-outside-{os.getpid()}"
    at = open_app()
    at.selectbox(key="probe_model").select("tiny").run()
    at.text_input(key="probe_out").input(str(outside / "job")).run()
    at.button(key="probe_start").click().run()
    assert len(at.error) == 1 and "outside the folders this app may open" in at.error[0].value
    assert not outside.exists() and "probe_job" not in at.session_state and not at.exception


def test_an_output_folder_that_is_a_file_is_one_line(app_env):
    (app_env / "cache").mkdir(exist_ok=True)
    blocker = app_env / "cache" / "a-file"
    blocker.write_text("x")
    at = open_app()
    at.text_input(key="probe_out").input(str(blocker)).run()
    at.button(key="probe_start").click().run()
    assert len(at.error) == 1 and "cannot use" in at.error[0].value and not at.exception
    assert blocker.read_text() == "x"


# ----------------------------------------------------------------------------- listening address


def listening_addresses(port: int) -> set[str]:
    """Local addresses in LISTEN state on ``port``, from /proc/net/tcp{,6} (no tool needed)."""
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(address)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(socket.inet_ntop(family, raw))
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's /proc/net/tcp")
@pytest.mark.timeout(150)
def test_started_from_another_directory_it_listens_on_loopback_only(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLIT_")}
    env |= {"HOME": str(tmp_path), "WORKBENCH_CACHE": str(tmp_path / "cache")}  # no ~/.streamlit of the user's
    with streamlit_app(MAIN, tmp_path, env, tmp_path / "streamlit.log") as (_, port):
        assert listening_addresses(port) == {"127.0.0.1"}


def test_listening_addresses_reads_proc_correctly():
    """The parser itself: a socket of ours on all interfaces is seen as such."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        assert listening_addresses(port) == {"0.0.0.0"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert listening_addresses(s.getsockname()[1]) == {"127.0.0.1"}


# ----------------------------------------------------------------------------- the shared model


def test_live_computations_on_the_shared_model_take_turns(monkeypatch):
    """Sessions are threads sharing one model: while one session's hooks or quantized weights are on it,
    another session's computation waits (else its forward would silently run under them)."""
    import threading
    import time

    monkeypatch.syspath_prepend(str(test_app.APPS))
    import wbapp.models

    monkeypatch.setattr(wbapp.models, "get_model", lambda name: f"model {name}")
    spans, start = {}, threading.Barrier(2)

    def session(tag, name):
        start.wait()
        if tag == "b":
            time.sleep(0.05)  # let "a" take the model first
        with wbapp.models.using_model(name) as model:
            assert model == f"model {name}"
            t0 = time.perf_counter()
            time.sleep(0.3)
            spans[tag] = (t0, time.perf_counter())

    threads = [threading.Thread(target=session, args=(tag, "tiny")) for tag in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a0, a1), (b0, b1) = spans["a"], spans["b"]
    assert b0 >= a1 or a0 >= b1  # never both inside at once
    took = []

    def other_model():
        with wbapp.models.using_model("smollm2-135m"):
            took.append(True)

    with wbapp.models.using_model("tiny"):  # another model's lock is another lock: no wait
        other = threading.Thread(target=other_model)
        other.start()
        other.join(timeout=5)
        assert took == [True]
