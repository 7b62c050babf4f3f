"""Topology: one layer at a time, the clean and adversarial diagrams, Betti curves and statistics of a run."""

import pandas as pd
import streamlit as st

from wbapp.figures import overlay_diagrams
from wbapp.runs import current_run, load_report
from wbapp.ui import missing, user_errors
from workbench.probe.figures import auc_figure, betti_figure, effect_heatmap, flow_figure, signature_figure
from workbench.topology.diagrams import diagrams_from_lists
from workbench.topology.plots import diagram_figure
from workbench.topology.signature import COMPRESSION_SIGNATURE

st.title("Topology")
run = current_run()
if run is None:
    missing("No probe report to show yet (pick one on the Runs page, or start one there).", "workbench probe --quick")
    st.stop()
with user_errors():
    report = load_report(run)
model = report.model_name

top = st.columns([1, 3])
condition = top[0].selectbox("condition", list(report.conditions), key="topo_condition")
result = report.conditions[condition]
layers = list(result.layers)
best = result.summary.best_topology_layer
layer = top[1].select_slider("layer", options=layers, value=best if best in layers else layers[0], key="topo_layer")
r = result.layers[layer]
adv = result.adversarial_label
st.caption(f"`{run}` · {model} · clean vs {adv} · k={r.k} points per subsample, "
           f"{r.n_clean} clean / {r.n_adversarial} {adv} prompts")

m = st.columns(4)
m[0].metric("AUC, PH summaries", f"{r.auc_topology:.3f}")
m[1].metric("AUC, linear probe", f"{r.auc_probe_rows:.3f}")
m[2].metric("features moved (q < 0.05)", len(r.moved))
m[3].metric("compression signature", f"{r.signature_agrees}/{len(r.signature)} agree")

# ------------------------------------------------------------------ diagrams
st.subheader(f"Persistence at layer {layer}")
diagrams = {name: diagrams_from_lists(pairs) for name, pairs in r.example_diagrams.items()}
if st.toggle("overlay clean and adversarial", key="topo_overlay"):
    st.plotly_chart(overlay_diagrams({name: diagram_figure(d) for name, d in diagrams.items()},
                                     f"one subsample per class, layer {layer}"), width="stretch")
else:
    cols = st.columns(len(diagrams))
    for col, (name, dgms) in zip(cols, diagrams.items(), strict=True):
        col.plotly_chart(diagram_figure(dgms, f"{name}, layer {layer}"), width="stretch", key=f"diagram-{name}")
b0, b1 = st.columns(2)
b0.plotly_chart(betti_figure(r, "H0 Betti curves", dim=0), width="stretch", key="betti0")
b1.plotly_chart(betti_figure(r, "H1 Betti curves", dim=1), width="stretch", key="betti1")

# ------------------------------------------------------------------ statistics
st.subheader("Summary features: attack vs clean")
table = pd.DataFrame({
    "feature": r.features, "mean clean": r.mean_clean, f"mean {adv}": r.mean_adversarial,
    "Hedges g": r.g, "g CI low": r.g_low, "g CI high": r.g_high, "p perm": r.p_perm,
    "q perm (BH)": r.q_perm, "q Welch (BH)": r.q_welch, "q parts (BH)": r.q_parts,
    "signature": [r.signature.get(f, "") for f in r.features],
})
only = st.checkbox("only features with q < 0.05", key="topo_only_moved")
shown = table[table["q perm (BH)"] < 0.05] if only else table
st.dataframe(shown.sort_values("Hedges g", key=abs, ascending=False), hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(format="%.3g") for c in table.columns[1:-1]})
expected = ", ".join(f"{f} {'higher' if sign > 0 else 'lower'}" for f, sign in COMPRESSION_SIGNATURE.items())
st.caption("95% bootstrap CIs; q: Benjamini-Hochberg across layers x features. Subsamples of one part overlap, "
           "so subsample-level p-values are optimistic; q parts is the honest Welch test on per-part means. "
           f"Compression signature under attack: {expected}.")
if r.moved:
    with st.expander(f"what moved at layer {layer}"):
        st.markdown("\n".join(f"- {s}" for s in r.moved))

# ------------------------------------------------------------------ across layers
st.subheader("Across layers")
a, s = st.columns(2)
for col, fig, key in ((a, auc_figure(result, "AUC by layer: PH vs linear probe"), "auc"),
                      (s, signature_figure(result, "signature features (Hedges g)"), "signature")):
    fig.add_vline(x=layer, line_dash="dash", line_color="grey")
    col.plotly_chart(fig, width="stretch", key=key)
with st.expander("effect sizes of every summary feature"):
    st.plotly_chart(effect_heatmap(result, f"{model} / {condition}"), width="stretch", key="heatmap")
if result.neuron_flow.get("gaps"):
    flow = result.neuron_flow
    fig = flow_figure(flow, "neuron-level flow: total H1 persistence of neuron-pair clouds")
    if layer in flow["layers"]:  # the figure's x is the position in the captured layers, not the layer number
        fig.add_vline(x=flow["layers"].index(layer), line_dash="dash", line_color="grey")
    st.plotly_chart(fig, width="stretch", key="flow")
else:
    missing("This run has no neuron-level flow.", "workbench probe --quick  (flow_samples > 0, at least 2 layers)")
