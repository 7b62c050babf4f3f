"""The workbench app: ``streamlit run apps/main.py`` (binds to localhost via ``.streamlit/config.toml``).

Pages live in ``apps/views`` (one script each); shared logic in ``apps/wbapp``. ``?run=PATH`` or
``$WORKBENCH_APP_RUN`` opens the app on a probe report folder.
"""

import sys
from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `streamlit run` adds it; AppTest and other runners may not
    sys.path.insert(0, str(HERE))

st.set_page_config(page_title="workbench", page_icon=":material/hub:", layout="wide")

PAGES = [
    st.Page("views/runs.py", title="Runs", icon=":material/folder_open:", default=True),
    st.Page("views/topology.py", title="Topology", icon=":material/bubble_chart:"),
    st.Page("views/features.py", title="Features", icon=":material/category:"),
    st.Page("views/playground.py", title="Intervention playground", icon=":material/tune:"),
    st.Page("views/tools.py", title="Model tools", icon=":material/build:"),
]
st.navigation(PAGES).run()
