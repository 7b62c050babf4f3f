"""The Streamlit app, page by page, through Streamlit's AppTest (in-process, no browser).

Every page runs against a small probe report made here on the tiny model, and against no data at all:
missing results must show what to run, and user errors one line, never a traceback.
"""

import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

APPS = Path(__file__).resolve().parents[1] / "apps"
sys.path.insert(0, str(APPS))
MAIN = str(APPS / "main.py")
TIMEOUT = 120  # a loaded 2-core machine; the tiny model loads in seconds
SMALL = dict(model="tiny", n_pairs=24, k=12, K=6, n_parts=2, n_boot=50, n_perm=100, flow_samples=4, flow_gaps=(1,),
             layers=[0, 1, 3], batch_size=16)


def make_probe_report(tiny, folder: Path) -> Path:
    """A real, small probe report (resumes from its cache when the folder exists)."""
    from workbench.commands.probe import run_probe
    from workbench.probe import ProbeConfig

    run_probe(tiny, ProbeConfig(**SMALL), folder, progress=False)
    return folder


def make_sae(tiny, folder: Path) -> Path:
    """A small TopK SAE on the tiny model's layer-1 residual, with features.json beside it (a few seconds)."""
    import json

    import numpy as np

    from workbench.sae.features import describe_features
    from workbench.sae.train import TrainConfig, collect_activations, store_batches, train_sae

    sae_dir = folder / "sae-tiny-L1"
    if (sae_dir / "features.json").exists():
        return sae_dir
    text = folder / "text"
    text.mkdir(parents=True, exist_ok=True)
    words = ["river", "bank", "money", "loan", "water", "fish", "stream", "credit", "cash", "boat"]
    rng = np.random.default_rng(0)
    for d in range(8):
        (text / f"doc{d}.txt").write_text(" ".join(" ".join(rng.choice(words, 8)) + "." for _ in range(30)))
    site = "blocks.1.hook_resid_post"
    store = collect_activations(tiny, [site], folder / "acts", n_tokens=32 * 64, block_len=64, split="all",
                                source=text, batch_size=16, shard_blocks=32, progress=False)
    cfg = TrainConfig(site=site, architecture="topk", d_sae=64, k=4, n_tokens=4096, batch_size=256, lr=2e-3,
                      n_checkpoints=0, model_name="tiny")
    sae = train_sae(cfg, store_batches(store, site, 256), tiny.cfg.d_model, sae_dir, resume=False, progress=False)
    records = describe_features(tiny, sae, store, n_top=8, progress=False)
    (sae_dir / "features.json").write_text(json.dumps(records))
    return sae_dir


@pytest.fixture(scope="session")
def sae_dir(tiny, tmp_path_factory):
    pytest.importorskip("sae_lens")
    return make_sae(tiny, tmp_path_factory.getbasetemp() / "app-sae")


@pytest.fixture
def with_sae(app_env, sae_dir, monkeypatch):
    monkeypatch.setenv("WORKBENCH_APP_SAES", str(sae_dir.parent))
    return sae_dir


@pytest.fixture(scope="session")
def report_dir(tiny, tmp_path_factory):
    return make_probe_report(tiny, tmp_path_factory.getbasetemp() / "app-probe")


@pytest.fixture
def app_env(monkeypatch, tmp_path, tmp_path_factory):
    """An app that finds no runs of the user's, uses the tiny model on the live pages, and was started with
    ``-- --allow`` on the test folders (AppTest runs the script in this process: its sys.argv is ours)."""
    import wbapp.runs

    monkeypatch.setattr(sys, "argv", [MAIN, "--allow", str(tmp_path_factory.getbasetemp())])
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WORKBENCH_APP_MODEL", "tiny")
    monkeypatch.delenv("WORKBENCH_APP_RUN", raising=False)
    monkeypatch.setattr(wbapp.runs, "search_roots", lambda: [tmp_path / "runs"])
    return tmp_path


def open_page(page: str | None = None, run: Path | None = None) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    if run is not None:
        at.session_state["run_dir"] = str(run)
    at.run()
    if page:
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def plotly_charts(at: AppTest) -> list:
    return at.get("plotly_chart")


def texts(elements) -> str:
    return " | ".join(str(e.value) for e in elements)


# ----------------------------------------------------------------------------- Runs


def test_runs_page_without_data_says_what_to_run(app_env):
    at = open_page()
    assert at.title[0].value == "Runs"
    assert "workbench probe --quick" in texts(at.info)
    assert not at.error


def test_runs_page_finds_and_shows_a_report(app_env, report_dir, monkeypatch):
    import wbapp.runs

    monkeypatch.setattr(wbapp.runs, "search_roots", lambda: [report_dir.parent])
    at = open_page()
    assert at.selectbox(key="runs_found").value == str(report_dir.resolve())
    assert "tiny" in at.subheader[0].value
    assert len(at.dataframe[0].value) == 3  # one row per layer
    assert at.session_state["run_dir"] == str(report_dir.resolve())


def test_a_fresh_install_shows_the_committed_example_run(app_env, monkeypatch):
    """With nothing in the user cache, the first screen shows the example report shipped in apps/examples."""
    import wbapp.runs
    from wbapp.access import EXAMPLES, app_roots

    example = (EXAMPLES / "probe-smollm2-135m-quick").resolve()
    assert EXAMPLES in app_roots() and wbapp.runs.discover_runs([EXAMPLES]) == [example]
    monkeypatch.setattr(wbapp.runs, "search_roots", lambda: [app_env / "cache" / "runs", EXAMPLES])
    at = open_page()
    assert at.selectbox(key="runs_found").value == str(example)
    assert "SmolLM2" in at.subheader[0].value or "smollm2" in at.subheader[0].value
    assert len(at.dataframe[0].value) == 6  # the quick probe's six layers
    topology = open_page("topology", run=example)
    assert topology.get("plotly_chart") and not topology.error


def test_runs_page_typed_folder(app_env, report_dir):
    at = open_page()
    at.text_input(key="runs_typed").input(str(app_env / "nowhere")).run()
    at.button(key="runs_open").click().run()
    assert "no report.json" in at.error[0].value and not at.exception
    at.text_input(key="runs_typed").input(str(report_dir)).run()
    at.button(key="runs_open").click().run()
    assert not at.error and at.session_state["run_dir"] == str(report_dir.resolve())
    assert at.selectbox(key="runs_found").value == str(report_dir.resolve())
    assert len(at.dataframe[0].value) == 3


def test_quick_probe_starts_shows_progress_and_cancels(app_env):
    at = open_page()
    at.selectbox(key="probe_model").select("tiny").run()
    at.text_input(key="probe_out").input(str(app_env / "job")).run()
    at.button(key="probe_start").click().run()
    job = at.session_state["probe_job"]
    assert job.proc.poll() is None and job.args[job.args.index("probe"):][:2] == ["probe", "--quick"]
    assert at.get("progress") and at.button(key="probe_cancel")
    at.button(key="probe_cancel").click().run()
    assert job.proc.poll() is not None  # the child is gone
    assert "cancelled" in texts(at.warning)


def test_quick_probe_runs_to_the_end_and_becomes_the_selected_run(app_env):
    """The real job on the tiny model (about 40 s on a loaded 2-core machine)."""
    at = open_page()
    at.selectbox(key="probe_model").select("tiny").run()
    at.number_input(key="probe_pairs").set_value(20).run()
    out = app_env / "done"
    at.text_input(key="probe_out").input(str(out)).run()
    at.button(key="probe_start").click().run()
    job = at.session_state["probe_job"]
    job.proc.wait(300)
    at.run()
    assert not at.exception and not at.error, job.log_text[-2000:]
    assert "probe finished" in at.success[0].value
    assert at.session_state["run_dir"] == str(out.resolve())
    assert at.selectbox(key="runs_found").value == str(out.resolve())
    assert len(at.dataframe[0].value) == 4  # the tiny model's four layers
    from workbench.progress import read_progress

    last = read_progress(out / "app-progress.json")  # the bars' own record, not a parse of the terminal
    assert last["stage"] == "topology" and last["n"] == last["total"] == 4


def test_probe_job_progress_from_the_bars_and_errors_from_its_log(tmp_path, monkeypatch):
    from wbapp.runs import PROGRESS_FILE, ProbeJob
    from workbench import progress
    from workbench.progress import progress_bar, reporting

    monkeypatch.setattr(progress, "MIN_INTERVAL_S", 0.0)  # every redraw is written (default: at most 4 a second)
    class Running:
        def poll(self):
            return None

    job = ProbeJob(out=tmp_path, args=[], proc=Running())
    assert job.progress() == (0.02, "loading the model")
    with reporting(tmp_path / PROGRESS_FILE):
        for _ in progress_bar(range(20), desc="capture tiny", unit="prompt", mininterval=0):
            pass
        assert job.progress() == (0.45, "capture tiny: 20/20 prompt")
        bar = progress_bar(total=4, desc="topology injection", unit="layer", mininterval=0)
        bar.update(2)
        fraction, label = job.progress()
        bar.update(2)
        bar.close()
    assert label == "topology injection: 2/4 layer" and fraction == pytest.approx(0.45 + 0.5 * 0.5)
    assert job.progress() == (pytest.approx(0.95), "topology injection: 4/4 layer")
    (tmp_path / "app-probe.log").write_text("loading\nerror: unknown model 'nope': see `workbench models`\n")
    assert job.error_line() == "error: unknown model 'nope': see `workbench models`"


# ----------------------------------------------------------------------------- Topology


def test_topology_page_renders_and_follows_the_layer(app_env, report_dir):
    at = open_page("topology", run=report_dir)
    assert at.title[0].value == "Topology" and not at.error
    # two diagrams, two Betti panels, AUC, signature, heatmap, flow
    assert len(plotly_charts(at)) == 8
    slider = at.select_slider(key="topo_layer")
    assert slider.options == ["0", "1", "3"]
    slider.set_value(3).run()
    assert "layer 3" in at.subheader[0].value and not at.exception
    table = at.dataframe[0].value
    assert {"Hedges g", "g CI low", "g CI high", "q perm (BH)"} <= set(table.columns)
    assert len(table) == 62
    at.checkbox(key="topo_only_moved").check().run()
    assert len(at.dataframe[0].value) <= len(table)
    at.toggle(key="topo_overlay").set_value(True).run()
    assert len(plotly_charts(at)) == 7 and not at.exception  # the two diagrams in one


def test_topology_page_without_a_run(app_env):
    at = open_page("topology")
    assert "workbench probe --quick" in texts(at.info) and not at.get("plotly_chart")


def test_topology_page_with_a_broken_report(app_env):
    bad = app_env / "bad"
    bad.mkdir()
    (bad / "report.json").write_text("{not json")
    at = open_page("topology", run=bad)
    assert len(at.error) == 1 and "not a readable probe report" in at.error[0].value
    assert not at.exception


# ----------------------------------------------------------------------------- Features


def test_features_page_says_what_to_run_without_an_sae(app_env):
    at = open_page("features")
    assert at.title[0].value == "Features"
    assert "workbench sae train" in texts(at.info) and not at.error


def test_features_page_names_the_describe_command_for_an_undescribed_sae(app_env, sae_dir, monkeypatch):
    import shutil

    bare = app_env / "saes" / "bare"
    shutil.copytree(sae_dir, bare, ignore=shutil.ignore_patterns("features.json", "description_embeddings.npy"))
    monkeypatch.setenv("WORKBENCH_APP_SAES", str(bare.parent))
    at = open_page("features")
    assert f"workbench sae features {bare.resolve()} --model tiny" in texts(at.info) and not at.error


def test_features_page_browses_a_feature(with_sae):
    at = open_page("features")
    assert not at.error
    assert isinstance(at.session_state["feat_feature"], int)
    assert [m.label for m in at.metric] == ["max activation", "firing frequency", "token set"]
    assert len(plotly_charts(at)) == 2  # the activation histogram and the interference base rates
    assert "workbench sae interference" in at.info[0].value  # no map yet: the command that makes it
    interfering, semantic = at.dataframe[0].value, at.dataframe[1].value
    assert len(interfering) == 10 and interfering["interference"].is_monotonic_decreasing
    assert len(semantic) == 10 and semantic["semantic cos"].is_monotonic_decreasing
    at.text_input(key="feat_query").input("fires on").run()
    assert not at.exception


def test_features_page_lists_unrelated_interfering_pairs(app_env, sae_dir, tiny, monkeypatch):
    import json
    import shutil

    import numpy as np

    from workbench.commands.sae import run_interference
    from workbench.sae.features import embed_texts
    from workbench.sae.train import EMBEDDINGS_FILE

    copy = app_env / "saes" / sae_dir.name
    shutil.copytree(sae_dir, copy)
    records = json.loads((copy / "features.json").read_text())  # what `workbench sae features` also saves
    np.save(copy / EMBEDDINGS_FILE, embed_texts([r["description"] for r in records]))
    run_interference(str(copy), tiny, k=8, min_interference=0.0, cutoff=0.4)
    monkeypatch.setenv("WORKBENCH_APP_SAES", str(copy.parent))
    at = open_page("features")
    assert not at.error and not at.info
    pairs = at.dataframe[2].value
    assert len(pairs) > 0 and {"i", "j", "interference"} <= set(pairs.columns)


def test_features_page_matches_features_across_saes(app_env, sae_dir, monkeypatch):
    """Against a copy of itself every feature matches itself, so interference there equals interference here."""
    import shutil

    import numpy as np

    for name in ("a", "b"):
        shutil.copytree(sae_dir, app_env / "pair" / name)
    monkeypatch.setenv("WORKBENCH_APP_SAES", str(app_env / "pair"))
    at = open_page("features")
    assert not at.error and at.selectbox(key="feat_other").value.endswith("b")
    matched = int(at.metric[3].value.split()[0].replace(",", ""))
    assert matched > 0
    assert at.metric[4].value == str(at.session_state["feat_feature"])
    table = at.dataframe[-1].value
    assert len(table) > 0 and (table["feature"] == table["match there"]).all()
    assert np.allclose(table["interference here"], table["interference there"], atol=1e-4)
    at.slider(key="feat_min_sim").set_value(0.95).run()
    assert not at.exception


# ----------------------------------------------------------------------------- playground


def open_playground() -> AppTest:
    """The playground with its model loaded (the page asks first when this process does not hold it yet)."""
    at = open_page("playground")
    if [b for b in at.button if b.key == "play_load"]:
        at.button(key="play_load").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_playground_loads_its_model_only_when_asked(app_env, monkeypatch):
    import wbapp.models

    monkeypatch.setattr(wbapp.models, "LOADED", set())  # as in a fresh app process
    at = open_page("playground")
    assert at.button(key="play_load").label == "Load tiny" and "nothing is loaded until you ask" in at.info[0].value
    assert not [r for r in at.radio if r.key == "play_locus"] and not wbapp.models.LOADED  # no model touched
    at.button(key="play_load").click().run()
    assert not at.exception and "tiny" in wbapp.models.LOADED and at.radio(key="play_locus").value == "prompt"


def test_playground_neuron_intervention_shows_bars_and_kl(app_env):
    at = open_playground()
    assert at.selectbox(key="play_model").value == "tiny"
    at.radio(key="play_locus").set_value("neuron").run()
    at.text_input(key="play_neurons").input("0, 5, 9").run()
    at.slider(key="play_scale").set_value(8.0).run()
    at.number_input(key="play_new").set_value(4).run()
    at.button(key="play_run").click().run()
    assert not at.exception and not at.error
    assert len(plotly_charts(at)) == 1
    kl = float(at.metric[0].value.split()[0])
    assert kl > 0
    assert len(at.code) == 2


def test_playground_prompt_locus_and_bad_input(app_env):
    at = open_playground()
    at.button(key="play_run").click().run()  # default locus: prompt (prepend a snippet)
    assert not at.exception and len(plotly_charts(at)) == 1
    at.radio(key="play_locus").set_value("neuron").run()
    at.text_input(key="play_neurons").input("1, x").run()
    at.button(key="play_run").click().run()
    assert len(at.error) == 1 and "integers" in at.error[0].value and not at.exception
    at.text_input(key="play_neurons").input("100000").run()
    at.button(key="play_run").click().run()
    assert "0..255" in at.error[0].value


@pytest.mark.parametrize("locus", ["token", "feature"])
def test_playground_sae_loci_say_what_to_run(app_env, locus):
    at = open_playground()
    at.radio(key="play_locus").set_value(locus).run()
    assert "workbench sae train" in texts(at.info)
    assert at.button(key="play_run").disabled


@pytest.mark.parametrize("locus", ["feature", "token", "prompt", "neuron"])
def test_playground_sae_loci_move_the_next_token(with_sae, locus):
    at = open_playground()
    at.radio(key="play_locus").set_value(locus).run()
    if locus in ("prompt", "neuron"):
        at.radio(key="play_source").set_value("an SAE feature").run()
    at.number_input(key="play_new").set_value(3).run()
    at.button(key="play_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    shift = at.session_state["play_result"][1]
    assert shift.kl > 0 and len(plotly_charts(at)) == 1
    assert {"overlap_before", "overlap_after", "n_entered_topk"} <= set(shift.metrics)


# ----------------------------------------------------------------------------- Model tools


def test_model_tools_studies_and_a_quantization_setting(app_env):
    at = open_page("tools")
    assert at.title[0].value == "Model tools"
    assert len(at.tabs) == 2
    profiles = set(at.selectbox(key="sparse_attention_model").options)  # the committed quick and full profiles
    assert {"smollm2-135m (quick profile)", "smollm2-135m (full profile)", "gemma3-270m (full profile)"} <= profiles
    at.selectbox(key="quant_setting").select("A4").run()
    at.button(key="quant_run").click().run()
    assert not at.exception and not at.error
    assert at.session_state["quant_shift"][0] == "A4"


def test_model_tools_sparse_attention_on_a_text(app_env):
    at = open_page("tools")
    at.selectbox(key="attn_method").select("topk").run()
    at.text_input(key="attn_param").input("8").run()
    at.text_area(key="attn_text").input("The committee met on Tuesday to review the budget and the plans.").run()
    at.button(key="attn_run").click().run()
    assert not at.exception and not at.error
    rows = at.session_state["attn_rows"]
    assert [r["method"] for r in rows] == ["full", "topk:8"] and rows[1]["loaded"] < 1


def test_model_tools_without_study_results(app_env, monkeypatch):
    import wbapp.runs

    monkeypatch.setattr(wbapp.runs, "REPO", app_env)  # a checkout with no studies/*/results
    at = open_page("tools")
    info = texts(at.info)
    assert "study run studies/quantization/config.yaml" in info and "studies/sparse_attention/config.yaml" in info
    assert not at.get("plotly_chart") and not at.error


def test_config_binds_to_localhost():
    """Beside the script, so it applies from any working directory (tests/test_reliability_app.py runs it)."""
    import tomllib

    config = tomllib.loads((APPS / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "127.0.0.1" and config["server"]["headless"] is True
    assert config["browser"]["gatherUsageStats"] is False


def test_workbench_app_serves_the_installed_app_on_localhost_from_any_folder(tmp_path):
    """`workbench app` runs the app shipped in the package (workbench.apps, with its script-level settings) from a
    folder outside the repository, on 127.0.0.1, until stopped; a bad port is one line."""
    import os
    import shutil
    import socket
    import subprocess
    import time
    import urllib.request
    from importlib.resources import files

    shipped = files("workbench.apps")
    assert (shipped / "main.py").is_file() and (shipped / ".streamlit" / "config.toml").is_file()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("workbench")
    bad = subprocess.run([exe, "app", "--port", "0"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --port must be between 1 and 65535, got 0"
    server = subprocess.Popen([exe, "app", "--port", str(port), "--no-browser"], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "WORKBENCH_APP_MODEL": "tiny"})
    try:
        deadline, health = time.time() + 90, None
        while time.time() < deadline and health != "ok":
            time.sleep(1)
            assert server.poll() is None, server.stdout.read()
            try:
                health = urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read().decode()
            except OSError:
                continue
        assert health == "ok"
        if shutil.which("ss"):  # the socket table: only the loopback address listens on the port
            listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout
            assert listening and all("127.0.0.1:" in line for line in listening.splitlines()), listening
    finally:
        server.terminate()  # the command became Streamlit (execv): this stops the server, leaving no orphan
        server.wait(timeout=30)
    assert subprocess.run(["pgrep", "-f", "--", f"--server.port {port}"], capture_output=True).returncode == 1
