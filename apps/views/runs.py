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
from workbench.probe import summary_table

st.title("Runs")

# ------------------------------------------------------------------ pick a run
runs = discover_runs()
selected = current_run()
left, right = st.columns([3, 2])
with left:
    if runs:
        labels = {str(p): f"{p.name}  ·  {time.strftime('%Y-%m-%d %H:%M', time.localtime((p / 'report.json').stat().st_mtime))}"
                  for p in runs}
        options = list(labels)
        index = options.index(str(selected)) if selected and str(selected) in options else None
        choice = st.selectbox("report folders found", options, index=index, format_func=labels.get,
                              placeholder="choose a run", key="runs_found")
        if choice and choice != str(selected):
            select_run(choice)
            selected = Path(choice)
    else:
        missing("No probe reports found in the user cache or the studies' results.", "workbench probe --quick")
with right:
    typed = st.text_input("or a folder path", key="runs_typed", placeholder="/path/to/probe-folder")
    if st.button("Open folder", key="runs_open", disabled=not typed.strip()):
        try:
            load_report(typed.strip())
        except WorkbenchError as exc:
            st.error(str(exc))
        else:
            select_run(typed.strip())
            selected = Path(typed.strip()).expanduser()

if selected:
    with user_errors():
        report = load_report(selected)
    config = report.get("config", {})
    st.subheader(f"{report['model'].get('name', '?')} · {', '.join(report['conditions'])}")
    st.caption(f"`{selected}` · {config.get('n_pairs', '?')} pairs, k={config.get('k', '?')}, "
               f"K={config.get('K', '?')}, {config.get('n_parts', '?')} parts, seed {config.get('seed', '?')}")
    st.dataframe(pd.DataFrame(summary_table(report)), hide_index=True, width="stretch")
    html = selected / "report.html"
    if html.is_file():
        st.download_button("report.html (offline)", html.read_bytes(), file_name="report.html", mime="text/html")
    st.page_link("views/topology.py", label="Explore its topology", icon=":material/bubble_chart:")

# ------------------------------------------------------------------ quick probe
st.divider()
st.subheader("Run a quick probe")
st.caption("`workbench probe --quick` in a background process: about two minutes on the embedded model "
           "with a quiet CPU, seconds on the tiny test model. The page stays usable; Cancel stops it.")
job: ProbeJob | None = st.session_state.get("probe_job")
running = job is not None and job.proc.poll() is None
c1, c2, c3 = st.columns(3)
choices = list(dict.fromkeys([default_model(), *MODEL_CHOICES]))
model = c1.selectbox("model", choices, key="probe_model", disabled=running)
pairs = c2.number_input("prompt pairs", min_value=20, max_value=2000, value=80, step=10, key="probe_pairs",
                        disabled=running, help="quick default: 80")
out = c3.text_input("output folder", value=str(cache_dir("runs") / f"probe-{model}-quick-app"), key="probe_out",
                    disabled=running)
if st.button("Start quick probe", key="probe_start", type="primary", disabled=running):
    st.session_state["probe_job"] = job = ProbeJob.start(model, out, pairs=int(pairs))
    running = True


@st.fragment(run_every=1.0)
def job_status():
    """Polls the background probe; reruns the whole page once when it finishes."""
    job = st.session_state.get("probe_job")
    if job is None:
        return
    fraction, label = job.progress()
    code = job.proc.poll()
    if code is None:
        st.progress(fraction, text=f"{label} · {time.time() - job.started:.0f} s")
        if st.button("Cancel", key="probe_cancel"):
            job.cancel()
            st.session_state["probe_job"] = None
            st.warning("probe cancelled; run it again to resume from its cached stages")
        return
    st.session_state["probe_job"] = None
    if code == 0:
        select_run(job.out)
        st.session_state["probe_done"] = str(job.out)
    else:
        st.session_state["probe_failed"] = job.error_line()
    st.rerun(scope="app")


if running:
    job_status()
if st.session_state.get("probe_done"):
    st.success(f"probe finished: {st.session_state.pop('probe_done')} is now the selected run")
if st.session_state.get("probe_failed"):
    st.error(st.session_state.pop("probe_failed"))
