"""One exception type for every user-facing mistake.

The command line prints such an error as a single ``error: ...`` line and exits with
status 2; from Python it is an ordinary ``ValueError`` so notebooks show it plainly.
"""


class BarterError(ValueError):
    """Bad input: the message is one line and says what is allowed."""


def choose(kind: str, name: str, allowed) -> None:
    """Raise a :class:`BarterError` unless ``name`` is one of ``allowed``."""
    if name not in allowed:
        raise BarterError(f"unknown {kind} {name!r}: choose one of {', '.join(sorted(allowed))}")
