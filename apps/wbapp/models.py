"""Models for the live pages, loaded once per process and shared by every session.

Sessions run in threads of one process and share one model object; hooks (and the reversible weight
quantization) change that object while a computation runs, so every live computation takes the model's
lock (``using_model``): another session's forward never sees this one's hooks or quantized weights.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import streamlit as st

# The embedded default first; `tiny` (random weights) makes the live pages testable in seconds.
MODEL_CHOICES = ("smollm2-135m", "gemma3-270m", "tiny")


def default_model() -> str:
    """``$WORKBENCH_APP_MODEL`` (tests use ``tiny``) or the embedded default."""
    return os.environ.get("WORKBENCH_APP_MODEL", MODEL_CHOICES[0])


def model_picker(key: str) -> str:
    choices = list(MODEL_CHOICES)
    default = default_model()
    if default not in choices:
        choices.insert(0, default)
    return st.selectbox("model", choices, index=choices.index(default), key=key,
                        help="smollm2-135m is the embedded default; tiny is a random test model")


LOADED: set[str] = set()  # the models this app process holds: a page offers to load any other on first use


@st.cache_resource(show_spinner="loading the model's weights (once per app process; the first time ever, the "
                                "GGUF is also dequantized into the user cache, about a minute)...")
def _cached_model(name: str):
    from workbench.models import load_model

    return load_model(name)


def get_model(name: str):
    """The hooked model, on the CPU unless a GPU is there; cached so every page and session shares it."""
    model = _cached_model(name)
    LOADED.add(name)
    return model


def load_on_first_use(name: str, key: str) -> None:
    """Stop the page with a "Load" button while ``name`` is not loaded in this process, so opening a page never
    costs a model load the user did not ask for."""
    if name in LOADED or st.session_state.get(f"{key}:{name}"):
        return
    st.info(f"This page runs {name} in the app process. Loading it takes seconds once its weights are in the "
            "user cache, about a minute the first time; nothing is loaded until you ask.")
    if st.button(f"Load {name}", key=key, type="primary"):
        st.session_state[f"{key}:{name}"] = True
        st.rerun()
    st.stop()


@st.cache_resource(show_spinner=False)
def _model_lock(name: str) -> threading.RLock:
    return threading.RLock()


@contextlib.contextmanager
def using_model(name: str) -> Iterator:
    """The shared model, held exclusively by this session for a computation that hooks or changes it."""
    with _model_lock(name):
        yield get_model(name)
