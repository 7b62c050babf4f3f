"""The workbench app: ``streamlit run apps/main.py [-- --allow FOLDER ...]`` from any directory.

It listens on 127.0.0.1 only: Streamlit reads ``apps/.streamlit/config.toml`` from beside this script.
Pages live in ``apps/views`` (one script each); shared logic in ``apps/wbapp``. ``?run=PATH`` or
``$WORKBENCH_APP_RUN`` opens the app on a probe report folder; the app reads and writes only inside
the folders ``wbapp.access`` allows (the user cache, studies/, ``--allow`` folders).
"""

import sys
from pathlib import Path

import streamlit as st
from streamlit import config

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `streamlit run` adds it; AppTest and other runners may not
    sys.path.insert(0, str(HERE))

st.set_page_config(page_title="workbench", page_icon=":material/hub:", layout="wide")

if not config.get_option("server.address") and not config.get_option("global.appTest"):
    # No address means every interface: a Streamlit too old to read apps/.streamlit/config.toml.
    # (AppTest serves nothing; it sets global.appTest, seen through config.get_option only.)
    st.error("This app serves model internals and local files, so it listens on localhost only; this Streamlit "
             "did not apply apps/.streamlit/config.toml. Restart it with `--server.address 127.0.0.1`.")
    st.stop()

PAGES = [
    st.Page("views/runs.py", title="Runs", icon=":material/folder_open:", default=True),
    st.Page("views/topology.py", title="Topology", icon=":material/bubble_chart:"),
    st.Page("views/features.py", title="Features", icon=":material/category:"),
    st.Page("views/playground.py", title="Intervention playground", icon=":material/tune:"),
    st.Page("views/tools.py", title="Model tools", icon=":material/build:"),
]
st.navigation(PAGES).run()
