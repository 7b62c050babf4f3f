"""Features: browse an SAE's features (top contexts, activation histogram, interfering and related features)."""

import streamlit as st
from wbapp.models import default_model
from wbapp.sae import find_saes, has_module, sae_status
from wbapp.ui import missing

st.title("Features")
saes = find_saes() if has_module("features") else []
if not saes:
    missing(*sae_status(default_model(), "feature browser"))
    st.stop()
st.selectbox("SAE", [str(p) for p in saes], key="feat_sae")
missing("The feature browser for trained SAEs is not wired yet in this version.", "workbench sae features --help")
