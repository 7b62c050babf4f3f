"""Shared fixtures: the tiny random model for fast tests, the embedded models for the real checks.

Embedded models load from the user cache (dequantized once, then seconds), so they are session-scoped.
"""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach for a hub


@pytest.fixture(scope="session")
def tiny():
    from workbench.models import load_model

    return load_model("tiny", device="cpu")


@pytest.fixture(scope="session")
def smollm2():
    from workbench.models import load_model

    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def gemma3():
    from workbench.models import load_model

    return load_model("gemma3-270m", device="cpu")
