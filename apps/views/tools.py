"""Model tools: the quantization and sparse-attention studies' results, and one setting tried on a prompt."""

import json

import pandas as pd
import streamlit as st

from wbapp.compare import next_token_shift, shift_figure
from wbapp.models import default_model, get_model, model_picker, using_model
from wbapp.runs import REPO
from wbapp.ui import missing, user_errors
from workbench.models import format_chat, has_chat_template

STUDIES = {
    "quantization": ("workbench study run studies/quantization/config.yaml --quick", "setting"),
    "sparse_attention": ("workbench study run studies/sparse_attention/config.yaml --quick", "method"),
}
TEXT = ("The committee met on Tuesday to review the budget. After a long discussion about the costs of the new "
        "library wing, the members agreed to postpone the decision until the next quarterly meeting, when the "
        "final estimates from the architects would be available. The chair thanked everyone and closed the")


def study_results(study: str) -> dict[str, dict]:
    """``results.json`` of every committed profile of a study (``results/`` is its quick profile, a full run has its
    own ``results-*`` folder), keyed by "model (quick|full profile)"."""
    out = {}
    for path in sorted((REPO / "studies" / study).glob("results*/*/results.json")):
        try:
            record = json.loads(path.read_text())
        except ValueError:
            st.warning(f"{path} is not valid JSON; re-run the study")
            continue
        quick = (record.get("config") or {}).get("quick")
        out[path.parent.name + {True: " (quick profile)", False: " (full profile)"}.get(quick, "")] = record
    return out


def show_study(study: str, figure, log_y: bool = False) -> None:
    command, key = STUDIES[study]
    results = study_results(study)
    if not results:
        missing(f"No {study.replace('_', ' ')} results yet.", command)
        return
    models = sorted(results, key=lambda m: (m.split(" ")[0] != default_model(), m))  # the embedded default first
    model = st.selectbox("results for", models, key=f"{study}_model")
    record = results[model]
    rows = record["rows"]
    flat = pd.DataFrame([{k: v for k, v in r.items() if not isinstance(v, list | dict)} for r in rows])
    st.dataframe(flat, hide_index=True, width="stretch")
    try:
        fig = figure(rows, f"{study.replace('_', ' ')} on {model}")
        if log_y:  # a few broken settings would flatten every other bar
            fig.update_yaxes(type="log", row=1, col=1)
        st.plotly_chart(fig, width="stretch", key=f"{study}_fig")
    except (KeyError, TypeError):
        st.warning(f"these results were written by an older version of the study: re-run `{command}`")
    with st.expander("configuration"):
        st.json(record.get("config", {}), expanded=False)


st.title("Model tools")
quant_tab, attention_tab = st.tabs(["Quantization", "Sparse attention"])

with quant_tab:
    from workbench.tools.quant_eval import PRESETS, apply_setting, quant_figure

    show_study("quantization", quant_figure, log_y=True)
    st.subheader("Try a setting on a prompt")
    c = st.columns([1, 1, 2])
    with c[0]:
        name = model_picker("quant_try_model")
    setting = c[1].selectbox("setting", [s for s in PRESETS if s != "float"], key="quant_setting")
    prompt = c[2].text_input("prompt", "The capital of France is", key="quant_prompt")
    if st.button("Compare with float", key="quant_run", type="primary"):
        with user_errors():
            model = get_model(name)
            text = format_chat(model, prompt) if has_chat_template(model) else prompt
            with st.spinner(f"running {setting} and float"), using_model(name):  # weights change while it runs
                st.session_state["quant_shift"] = (setting, next_token_shift(
                    model, text, change=lambda: apply_setting(model, setting), new_tokens=12))
    if st.session_state.get("quant_shift"):
        shown, shift = st.session_state["quant_shift"]
        st.plotly_chart(shift_figure(shift, f"float (before) vs {shown} (after)"), width="stretch", key="quant_bars")
        cols = st.columns(2)
        cols[0].code(shift.continuation_before or "(none)", language=None, wrap_lines=True)
        cols[1].code(shift.continuation_after or "(none)", language=None, wrap_lines=True)

with attention_tab:
    from workbench.tools.sparse_attention import SELECTORS, attention_figure, compare_attention

    show_study("sparse_attention", attention_figure)
    st.subheader("Try a method on a text")
    st.caption("Dense prefill of the first half of the text, then teacher-forced decoding of the rest under the "
               "method and under full attention (short texts: give budgets in keys well below the text length).")
    c = st.columns([1, 1, 1])
    with c[0]:
        name = model_picker("attn_try_model")
    method = c[1].selectbox("method", [m for m in SELECTORS if m != "full"], key="attn_method")
    param = c[2].text_input("P or budget", "0.9" if method in ("topp", "tactic") else "16", key="attn_param",
                            help="P (attention mass) for topp/tactic; keys per head for the others")
    text = st.text_area("text", TEXT, height=100, key="attn_text")
    if st.button("Compare with full attention", key="attn_run", type="primary"):
        with user_errors():
            model = get_model(name)
            tokens = model.to_tokens(text)
            if tokens.shape[1] < 8:
                st.error("the text is too short: give at least a sentence")
                st.stop()
            with st.spinner(f"decoding under {method}"), using_model(name):
                rows = compare_attention(model, tokens, tokens.shape[1] // 2, ["full", f"{method}:{param}"],
                                         progress=False)
            st.session_state["attn_rows"] = rows
    if st.session_state.get("attn_rows"):
        st.dataframe(pd.DataFrame([{k: v for k, v in r.items() if k != "per_layer"}
                                   for r in st.session_state["attn_rows"]]), hide_index=True, width="stretch")
