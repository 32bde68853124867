"""One exception type for every user-facing mistake, the checks that raise it, and how a
command line of the package reports it.

A command line (``barter-mini``, ``python -m barter_mini.book.room``) prints such an error as
a single ``error: ...`` line and exits with status 2 (:func:`exit_status`); from Python it is
an ordinary ``ValueError`` so notebooks show it plainly.
"""

from __future__ import annotations

import argparse
import math
import numbers
import signal
import sys
import unicodedata
from typing import Callable


class BarterError(ValueError):
    """Bad input: the message is one line and says what is allowed. ``details``: lines the
    command line prints after it (a failed notebook's traceback), never before."""

    details: tuple[str, ...] = ()

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for it (a notebook, a papermill run with a bad parameter): the
        one line, as the command line prints it, instead of a traceback through the library
        that buries it; ``ename`` and ``evalue`` of the cell's error are unchanged."""
        return [f"error: {self}"]


class TrainingInterrupted(Exception):
    """SIGTERM or SIGINT stopped a training run after it wrote its ``last.pt`` at the end of
    step ``step``; the same command with ``--resume`` continues it. The command line exits
    with ``128 + signum``, the status a shell gives a process ended by that signal."""

    def __init__(self, signum: int, step: int, checkpoint):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(f"{signal.Signals(signum).name} at step {step}: {checkpoint} written; "
                         "continue with the same command and --resume")


class TrainingDiverged(RuntimeError):
    """Training diverged at optimizer step ``step``: its loss, or a statistic a method was
    about to decide on, is not finite (the run stops before taking that step), or the loss
    over the last steps is far worse than chance (it stops after it). ``what`` says which.
    ``checkpoint`` is the ``last.pt`` the trainer then wrote and ``kept_step`` the step it
    holds: the last with finite values (None until written). The command line prints the
    message on one line and exits with :data:`DIVERGED_STATUS`."""

    def __init__(self, step: int, what: str, checkpoint=None, kept_step: int | None = None, hint: str = ""):
        self.step, self.what, self.hint = step, what, hint
        self.checkpoint, self.kept_step = checkpoint, kept_step
        super().__init__(step, what)

    def __str__(self) -> str:
        finite = ", the last with finite values" if self.kept_step == self.step - 1 else ""
        kept = f"; {self.checkpoint} holds step {self.kept_step}{finite}" if self.checkpoint is not None else ""
        return f"step {self.step}: {self.what}: the run stopped{kept}" + (f"; {self.hint}" if self.hint else "")


#: the exit status of a run that diverged (2 is bad input, 128 + N a signal)
DIVERGED_STATUS = 3


def choose(kind: str, name: str, allowed, extra: str = "") -> None:
    """Raise a :class:`BarterError` unless ``name`` is one of ``allowed`` (``extra`` names
    what else is allowed)."""
    try:
        known = name in allowed
    except TypeError:                   # an unhashable value (a list, a dict) is no name at all
        known = False
    if not known:
        raise BarterError(f"unknown {kind} {name!r}: choose one of {', '.join(sorted(allowed))}"
                          + (f" {extra}" if extra else ""))


def check_integer(name: str, value, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an int if it is an integer (not a bool) of at least ``minimum`` (and at
    most ``maximum``), else a :class:`BarterError` ("a positive integer" for the default
    minimum of 1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum or \
            (maximum is not None and value > maximum):
        allowed = (f"an integer in [{minimum}, {maximum}]" if maximum is not None else
                   "a positive integer" if minimum == 1 else f"an integer >= {minimum}")
        raise BarterError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


#: the largest seed every generator accepts (NumPy's are 32-bit)
MAX_SEED = 2**32 - 1


def check_seed(name: str, value) -> int:
    """``value`` as an int if it is a seed every random generator accepts, in [0, 2**32 - 1]."""
    return check_integer(name, value, minimum=0, maximum=MAX_SEED)


def check_list(name: str, value, what: str, allow_empty: bool = False) -> list:
    """``value`` as a list if it is a list or tuple (a notebook parameter such as ``seeds``)
    with at least one item unless ``allow_empty``, else a :class:`BarterError`: a bare number
    or string would otherwise be iterated digit by digit or fail with a ``TypeError``, and an
    empty grid would fail only once its tables are drawn."""
    if not isinstance(value, (list, tuple)):
        raise BarterError(f"{name} must be a list of {what}, got {value!r}")
    if not value and not allow_empty:
        raise BarterError(f"{name} is empty: list one or more {what}")
    return list(value)


def check_in_range(name: str, value, low: float, high: float, *, low_open: bool = False,
                   high_open: bool = False) -> float:
    """``value`` as a float if it is finite and lies in the interval from ``low`` to ``high``
    (each end closed unless ``*_open``; an infinite end is always open: only finite values
    pass), else a :class:`BarterError` naming the interval."""
    low_open, high_open = low_open or not math.isfinite(low), high_open or not math.isfinite(high)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or \
            value < low or value > high or (low_open and value == low) or (high_open and value == high):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise BarterError(f"{name} must be in {interval}, got {value!r}")
    return float(value)


#: the longest path an error shows whole; a longer one is shown by its ends and its length
MAX_SHOWN_PATH = 240


def shown_path(path) -> str:
    """``path`` as an error shows it: whole, or, past :data:`MAX_SHOWN_PATH` characters, its
    first and last 100 and its length (a 5,000-character path is not a screenful)."""
    text = str(path)
    if len(text) <= MAX_SHOWN_PATH:
        return text
    return f"{text[:100]}...{text[-100:]} ({len(text):,} characters)"


#: characters that move a terminal's cursor, change its state or reorder text, though not
#: control characters by their category: line and paragraph separators, bidirectional overrides
TERMINAL_FORMATTING = frozenset("\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def printable(line: str) -> str:
    """``line`` with every control character (ESC, a line break, a NUL, ...), surrogate (the
    undecodable bytes of a file name) and character in :data:`TERMINAL_FORMATTING` written as
    its Python escape (``\\x1b``), so a path in an error cannot drive the terminal; other
    text, every script's letters and symbols, is left as it is."""
    return "".join(ascii(char)[1:-1] if unicodedata.category(char) in ("Cc", "Cs") or char in TERMINAL_FORMATTING
                    else char for char in line)


# ----------------------------------------------------------------- how a command line reports them

class Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusal escapes the control characters of what it quotes
    (:func:`~barter_mini.errors.printable`): a value given on the command line."""

    def error(self, message: str):
        """Print the usage and the refusal ``message``, escaped, and exit with status 2."""
        super().error(printable(message))


class OneLineParser(Parser):
    """A parser whose refusal is the one line ``error: ...`` the package's own errors print,
    with no usage before it: for a command whose every failure is that one line."""

    def error(self, message: str):
        """Print the refusal ``message`` as one escaped ``error: ...`` line and exit with status 2."""
        self.exit(2, printable(f"error: {message}") + "\n")


def positive_int(text: str) -> int:
    """argparse's type for a count given on a command line (``--jobs``): an integer of 1 or more."""
    try:
        return check_integer("the value", int(text))
    except (ValueError, BarterError):
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None


def exit_status(work: Callable[[], int]) -> int:
    """``work()``'s exit status, or that of the failure it raised, printed on stderr as the
    command line prints each: a :class:`~barter_mini.errors.BarterError` as ``error: ...``
    (status 2), an interrupted run as ``interrupted: ...`` (128 + the signal), a diverged one
    as ``diverged: ...`` (:data:`~barter_mini.errors.DIVERGED_STATUS`)."""
    # each line is escaped whole (errors.printable): a path in it may hold control characters
    try:
        return work()
    except BarterError as error:
        print(printable(f"error: {error}"), file=sys.stderr)
        for line in error.details:      # a failed notebook's traceback: after the line that says what failed
            print(printable(f"  {line}"), file=sys.stderr)
        return 2
    except TrainingInterrupted as error:
        print(printable(f"interrupted: {error}"), file=sys.stderr)
        return 128 + error.signum
    except TrainingDiverged as error:
        print(printable(f"diverged: {error}"), file=sys.stderr)
        return DIVERGED_STATUS
