"""Small UI conventions shared by every page: user errors as one line, missing results as what to run."""

from __future__ import annotations

import contextlib

import streamlit as st

from workbench.errors import WorkbenchError


@contextlib.contextmanager
def user_errors():
    """Show a ``WorkbenchError`` as one red line (never a traceback) and stop the page there."""
    try:
        yield
    except WorkbenchError as exc:
        st.error(str(exc))
        st.stop()


def missing(what: str, command: str) -> None:
    """Say what is missing and the one command that produces it."""
    st.info(f"{what} Run `{command}`.", icon=":material/info:")
