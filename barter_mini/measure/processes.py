"""What the GPU commands need of the processes they start (the check's one process per model,
the graph check's fresh processes, the pair's ``train`` runs): the environment that makes a
child import this source tree, and the line of a failed child's error output that says why."""

from __future__ import annotations

import os
import re
from pathlib import Path

#: the last line of a Python traceback: the exception's (qualified) name and its message
EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception)\b")


def child_environment() -> dict:
    """This process's environment with the source tree first on ``PYTHONPATH``, so a child
    process imports the same ``barter_mini`` whether or not it is installed."""
    tree = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")]))}


def last_error_line(lines) -> str | None:
    """Why a child failed, from its error output ``lines``: the last exception line of a
    traceback, else the last line that is not blank (a one-line ``error: ...``), else None."""
    lines = [line.rstrip() for line in lines if line.strip()]
    exceptions = [line for line in lines if EXCEPTION_LINE.match(line)]
    return (exceptions or lines or [None])[-1]
