"""The Streamlit app (``workbench app``, or ``streamlit run apps/main.py``); installed as ``workbench.apps`` so the
command finds it from any folder. Pages are scripts in ``views/``; shared logic in ``wbapp``."""
