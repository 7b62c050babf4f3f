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


@st.cache_resource(show_spinner="loading the model (once per app process)...")
def get_model(name: str):
    """The hooked model, on the CPU unless a GPU is there; cached so every page and session shares it."""
    from workbench.models import load_model

    return load_model(name)


@st.cache_resource(show_spinner=False)
def _model_lock(name: str) -> threading.RLock:
    return threading.RLock()


@contextlib.contextmanager
def using_model(name: str) -> Iterator:
    """The shared model, held exclusively by this session for a computation that hooks or changes it."""
    with _model_lock(name):
        yield get_model(name)
