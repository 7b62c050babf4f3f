"""Features: what one SAE feature responds to, and which features interfere with it or mean the same."""

import html
import json
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from wbapp.models import default_model
from wbapp.sae import (
    FEATURES_FILE,
    feature_records,
    find_saes,
    get_sae,
    has_module,
    sae_status,
)
from wbapp.ui import missing, user_errors
from workbench.sae.train import EMBEDDINGS_FILE

st.title("Features")
saes = [p for p in find_saes() if (p / FEATURES_FILE).exists()] if has_module("features") else []
if not saes:
    missing(*sae_status(default_model(), "The feature browser"))
    st.stop()


@st.cache_resource(show_spinner="scanning decoder interference...", max_entries=4)
def interference(path: str, k: int):
    from workbench.sae.interference import interference_scan

    return interference_scan(get_sae(path), k=k)


@st.cache_resource(show_spinner="embedding feature descriptions (MiniLM)...", max_entries=4)
def description_embeddings(path: str, mtime_ns: int):
    """The MiniLM embeddings `workbench sae features` saved (in the records' order), else computed once."""
    records = json.loads((Path(path) / FEATURES_FILE).read_text())
    order = [int(r["feature"]) for r in records]
    saved = Path(path) / EMBEDDINGS_FILE
    if saved.exists():
        emb = np.load(saved)
        if len(emb) == len(order):
            return order, emb
    from workbench.sae.features import embed_texts

    return order, embed_texts([r["description"] for r in records])


def highlight(context: str) -> str:
    """A context with its activating token (between « ») marked, safe as HTML."""
    from workbench.sae.features import MARK

    text = html.escape(context).replace(MARK[0], "<mark><b>").replace(MARK[1], "</b></mark>")
    return f"<code style='white-space: pre-wrap'>{text}</code>"


path = st.selectbox("SAE", [str(p) for p in saes], key="feat_sae", format_func=lambda p: f"{p}")
with user_errors():
    sae = get_sae(path)
    records = feature_records(path)
st.caption(f"site `{sae.cfg.metadata.hook_name}` · {sae.cfg.d_sae} features, {len(records)} described")

query = st.text_input("search descriptions", key="feat_query", placeholder="e.g. money")
live = sorted(records, key=lambda j: -records[j]["frequency"])
shown = [j for j in live if query.lower() in records[j]["description"].lower()] or live
feature = st.selectbox("feature (most frequent first)", shown, key="feat_feature",
                       format_func=lambda j: f"{j}: {records[j]['description'][:90]}")
r = records[feature]

m = st.columns(3)
m[0].metric("max activation", f"{r['max_activation']:.3g}")
m[1].metric("firing frequency", f"{r['frequency']:.2%}")
m[2].metric("token set", len(r["token_set"]))
st.markdown(f"**description** {html.escape(r['description'])}")

left, right = st.columns([3, 2])
with left:
    st.subheader("Top contexts")
    st.html("<br>".join(highlight(c) for c in r["contexts"]) or "no contexts")
    st.markdown("**fires on** " + ", ".join(f"`{t!r}`" for t in r["token_set_text"][:20]))
    st.markdown("**promotes (logit lens)** " + ", ".join(f"`{t!r}`" for t in r["logit_lens"][:10]))
with right:
    import plotly.graph_objects as go

    from workbench.sae.features import HIST_EDGES

    edges = HIST_EDGES[: len(r["histogram"]) + 1]  # log-spaced bins: categorical x keeps them equally wide
    fig = go.Figure(go.Bar(x=[f"{a:.2g}-{b:.2g}" for a, b in zip(edges[:-1], edges[1:], strict=True)],
                           y=r["histogram"]))
    fig.update_layout(title="activation histogram (non-zero activations)", xaxis_title="activation bin",
                      yaxis_title="tokens", template="plotly_white", height=340)
    st.plotly_chart(fig, width="stretch", key="feat_hist")

st.subheader("Neighbours")
k = min(10, sae.cfg.d_sae - 1)
with user_errors():
    scan = interference(path, k)
    order, emb = description_embeddings(path, (Path(path) / FEATURES_FILE).stat().st_mtime_ns)
row = {j: i for i, j in enumerate(order)}
semantic = emb @ emb[row[feature]] if feature in row else np.zeros(len(order))


def describe(j: int) -> str:
    return records[j]["description"][:100] if j in records else "(not described: dead or skipped)"


a, b = st.columns(2)
a.markdown("**Most interfering** (|cos| of decoder directions)")
a.dataframe(pd.DataFrame({
    "feature": scan["top_index"][feature], "interference": scan["top_cos"][feature],
    "semantic cos": [float(semantic[row[j]]) if j in row else np.nan for j in scan["top_index"][feature]],
    "description": [describe(int(j)) for j in scan["top_index"][feature]],
}), hide_index=True, width="stretch")
nearest = [order[i] for i in np.argsort(-semantic) if order[i] != feature][:k]
W = sae.W_dec.detach().float()
W = W / W.norm(dim=1, keepdim=True).clamp(min=1e-12)
b.markdown("**Semantically nearest** (cosine of MiniLM description embeddings)")
b.dataframe(pd.DataFrame({
    "feature": nearest, "semantic cos": [float(semantic[row[j]]) for j in nearest],
    "interference": [float((W[j] @ W[feature]).abs()) for j in nearest],
    "description": [describe(j) for j in nearest],
}), hide_index=True, width="stretch")

st.subheader("Interference map of this SAE")
bins_col, pairs_col = st.columns([2, 3])
with bins_col:
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(x=scan["bin_labels"], y=scan["base_rates"],
                           text=[f"{c:,}" for c in scan["bin_counts"]], textposition="outside"))
    fig.update_layout(title=f"base rates over all {scan['n_pairs']:,} decoder pairs", xaxis_title="|cos| bin",
                      yaxis_title="fraction of pairs", yaxis_type="log", template="plotly_white", height=340)
    st.plotly_chart(fig, width="stretch", key="feat_bins")
with pairs_col:
    from workbench.sae.train import INTERFERENCE_FILE

    mapped = Path(path) / INTERFERENCE_FILE
    if mapped.exists():
        saved = json.loads(mapped.read_text())
        st.markdown(f"**Unrelated yet interfering pairs** ({saved['n_unrelated_interfering']:,} with |cos| >= "
                    f"{saved['min_interference']} in different semantic clusters at cutoff {saved['cutoff']})")
        st.dataframe(pd.DataFrame([{"i": p["i"], "j": p["j"], "interference": p["interference"],
                                    "i: description": describe(p["i"]), "j: description": describe(p["j"])}
                                   for p in saved["unrelated_interfering"][:50]]), hide_index=True, width="stretch")
    else:
        st.info(f"The unrelated-yet-interfering pairs need the semantic clusters: "
                f"`workbench sae interference {path}`")

st.subheader("Across models")
others = [p for p in map(str, saes) if p != path]
if not others:
    st.caption("Interference shared with another model needs a second described SAE (another model's): "
               "`workbench sae train --model MODEL`, then `workbench sae features`.")
    st.stop()
st.caption("Features are matched by what they mean (mutual nearest neighbours of their MiniLM description "
           "embeddings); a matched pair that interferes here is *shared* when its counterpart interferes there.")
c1, c2 = st.columns([3, 1])
other = c1.selectbox("compare with", others, key="feat_other")
min_sim = c2.slider("min description cosine", 0.3, 0.95, 0.6, 0.05, key="feat_min_sim")
with user_errors():
    from workbench.sae.shared import counterpart_interference, match_features, unit_rows

    other_records = feature_records(other)
    other_order, other_emb = description_embeddings(other, (Path(other) / FEATURES_FILE).stat().st_mtime_ns)
    matches = match_features(emb, order, other_emb, other_order, min_similarity=min_sim)
    Wb = unit_rows(get_sae(other).W_dec.detach().float().numpy())
m = st.columns(3)
m[0].metric("features matched", f"{len(matches):,} of {len(order):,}")
if feature not in matches:
    m[1].metric("this feature", "no match")
    st.info(f"Feature {feature} has no mutual match at description cosine >= {min_sim}: lower the threshold.")
    st.stop()
fb, sim = matches[feature]
m[1].metric("this feature's match", f"{fb}", f"description cos {sim:.2f}", delta_color="off")
st.markdown(f"**its description there** {html.escape(other_records.get(fb, {}).get('description', '?')[:200])}")
neighbours = [{"i": feature, "j": int(j), "interference": float(c)}
              for j, c in zip(scan["top_index"][feature], scan["top_cos"][feature], strict=True)]
rows = counterpart_interference(neighbours, matches, Wb)
m[2].metric("interfering neighbours matched", f"{len(rows)} of {len(neighbours)}")
st.dataframe(pd.DataFrame([{"feature": r["j"], "interference here": r["interference"], "match there": r["j_b"],
                            "interference there": r["interference_b"], "description": describe(r["j"])}
                           for r in rows], columns=["feature", "interference here", "match there",
                                                    "interference there", "description"]),
             hide_index=True, width="stretch")
