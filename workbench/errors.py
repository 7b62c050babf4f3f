"""The one exception type for everything a user can cause.

Its message says what was wrong and what to do; the CLI prints it alone.
"""


class WorkbenchError(Exception):
    """A user-facing error with a one-line, actionable message."""
