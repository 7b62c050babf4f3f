"""Runs: pick the probe report the other pages show, or start a quick probe in the background."""

import time
from pathlib import Path

import pandas as pd
import streamlit as st

from wbapp.models import MODEL_CHOICES, default_model
from wbapp.runs import ProbeJob, current_run, discover_runs, load_report, select_run
from wbapp.ui import missing, user_errors
from workbench.errors import WorkbenchError
from workbench.paths import cache_dir
from workbench.probe.figures import summary_table
from workbench.topology.signature import COMPRESSION_SIGNATURE


def stamp(folder: Path) -> str:
    report = folder / "report.json"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(report.stat().st_mtime)) if report.exists() else "?"


st.title("Runs")
COLUMN_LABELS = {  # the summary table's keys as a reader names them (g: Hedges' g, attack vs clean)
    "condition": "condition", "layer": "layer", "auc_ph": "AUC, PH summaries", "auc_probe": "AUC, linear probe",
    "g_h0_death_mean": "g: H0 mean death", "g_h1_count": "g: H1 bar count",
    "g_h1_persistence_mean": "g: H1 mean lifetime", "g_h1_entropy": "g: H1 entropy",
    "n_moved": "features moved", "signature": "signature features agreeing"}


def finish_job() -> None:
    """A finished background probe becomes the selected run (or its one-line error is shown)."""
    job: ProbeJob | None = st.session_state.get("probe_job")
    if job is None or job.proc.poll() is None:
        return
    st.session_state["probe_job"] = None
    if job.proc.returncode == 0:
        select_run(job.out.resolve())
        st.success(f"probe finished: {job.out} is now the selected run")
    else:
        st.error(job.error_line())


finish_job()

# ------------------------------------------------------------------ pick a run


def open_typed() -> None:
    """Callback of "Open folder": runs before the page, so the list below already shows the new choice."""
    typed = st.session_state["runs_typed"].strip()
    try:
        load_report(typed)  # refuses a folder outside the allowed roots before reading anything
        select_run(typed)
    except WorkbenchError as exc:
        st.session_state["runs_error"] = str(exc)


def choose_found() -> None:
    try:
        select_run(st.session_state["runs_found"])
    except WorkbenchError as exc:  # a found run reached through a symlink that leaves the allowed folders
        st.session_state["runs_error"] = str(exc)


runs = discover_runs()
selected = current_run()
if selected and selected.resolve() not in runs:  # typed, or given by ?run= / $WORKBENCH_APP_RUN
    runs.insert(0, selected.resolve())
left, right = st.columns([3, 2])
with left:
    if runs:
        labels = {str(p): f"{p.name}  ·  {stamp(p)}  ·  {p.parent}" for p in runs}
        st.session_state["runs_found"] = str(selected.resolve()) if selected else None  # follow other pages' choice
        st.selectbox("report folders", list(labels), format_func=labels.get, placeholder="choose a run",
                     key="runs_found", on_change=choose_found)
    else:
        missing("No probe reports found in the user cache or the studies' results.", "workbench probe --quick")
with right:
    typed = st.text_input("or a folder path", key="runs_typed", placeholder="/path/to/probe-folder")
    st.button("Open folder", key="runs_open", disabled=not typed.strip(), on_click=open_typed)
    if st.session_state.get("runs_error"):
        st.error(st.session_state.pop("runs_error"))

if selected:
    with user_errors():
        report = load_report(selected)
    config = report.config
    st.subheader(f"{report.model_name} · {', '.join(report.conditions)}")
    st.caption(f"`{selected}` · {config.n_pairs} pairs, k={config.k}, K={config.K}, {config.n_parts} parts, "
               f"seed {config.seed}")
    table = pd.DataFrame([{**r, "signature": f"{r['signature']}/{len(COMPRESSION_SIGNATURE)}"}
                          for r in summary_table(report)])
    st.dataframe(table, hide_index=True, width="stretch", column_config={
        c: (st.column_config.NumberColumn(COLUMN_LABELS.get(c, c), format="%.3f") if table[c].dtype.kind == "f"
            else st.column_config.Column(COLUMN_LABELS.get(c, c))) for c in table.columns})
    html = selected / "report.html"
    if html.is_file():
        st.download_button("report.html (offline)", html.read_bytes(), file_name="report.html", mime="text/html")
    st.page_link("views/topology.py", label="Explore its topology", icon=":material/bubble_chart:")

# ------------------------------------------------------------------ quick probe
st.divider()
st.subheader("Run a quick probe")
st.caption("`workbench probe --quick` in a background process: about two minutes on the embedded model "
           "with a quiet CPU, about one on the tiny test model. The page stays usable; Cancel stops it.")
job: ProbeJob | None = st.session_state.get("probe_job")
running = job is not None and job.proc.poll() is None
c1, c2, c3 = st.columns(3)
choices = list(dict.fromkeys([default_model(), *MODEL_CHOICES]))
model = c1.selectbox("model", choices, key="probe_model", disabled=running)
pairs = c2.number_input("prompt pairs", min_value=20, max_value=2000, value=80, step=10, key="probe_pairs",
                        disabled=running, help="quick default: 80")
default_out = str(cache_dir("runs") / f"probe-{model}-quick-app")  # follows the model chosen
out = c3.text_input("output folder", placeholder=default_out, key="probe_out", disabled=running,
                    help="empty: a folder in the user cache named after the model").strip() or default_out
if st.button("Start quick probe", key="probe_start", type="primary", disabled=running):
    with user_errors():  # an output folder outside the allowed roots: one line, nothing created
        st.session_state["probe_job"] = job = ProbeJob.start(model, out, pairs=int(pairs))
    running = True


@st.fragment(run_every=1.0)
def job_status():
    """Polls the background probe; reruns the whole page once it has finished."""
    job = st.session_state.get("probe_job")
    if job is None:
        return
    if job.proc.poll() is not None:
        st.rerun(scope="app")  # finish_job() at the top of the page takes it from there
    fraction, label = job.progress()
    st.progress(fraction, text=f"{label} · {time.time() - job.started:.0f} s")
    if st.button("Cancel", key="probe_cancel"):
        job.cancel()
        st.session_state["probe_job"] = None
        st.warning("probe cancelled; run it again to resume from its cached stages")


if running:
    job_status()
