"""One process at a time in a run folder or a cache entry: an exclusive, non-blocking lock.

``fcntl.flock`` on a small lock file: the kernel releases it when its holder exits, however
it exits (a SIGKILL included), so a killed run never leaves a stale lock; on NFS, Linux maps
it to a POSIX lock that the server arbitrates across nodes. A second process is refused at
once with a one-line :class:`~barter_mini.errors.BarterError` rather than made to wait, so a
duplicate job fails in seconds instead of holding a GPU for the length of a run. The file
records its holder (host and process) for that message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path
from typing import Iterator

from ..errors import BarterError


@contextlib.contextmanager
def exclusive_lock(path: Path, what: str, remove: bool = False) -> Iterator[None]:
    """Hold the lock on the file ``path`` (created if missing), or raise "``what`` is being
    trained by HOLDER" at once if another process holds it. ``remove``: delete the file when
    done, still holding the lock; a process that opened it before then finds, once it has
    the lock, that the path no longer names its file, and opens the path afresh."""
    path = Path(path)
    while True:
        handle = _open(path)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise BarterError(f"{what} is being trained by {holder} (lock {path}): "
                              "wait for it to finish, or stop it, then ask again") from None
        if _names(path, handle):
            break
        handle.close()                  # removed by its last holder after we opened it: again
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        yield
    finally:
        if remove:
            path.unlink(missing_ok=True)
        handle.close()


def _open(path: Path):
    try:
        return open(path, "a+")
    except OSError as error:
        raise BarterError(f"cannot create the lock file {path} ({error.strerror or type(error).__name__}): "
                          "choose a folder you may write in") from None


def _names(path: Path, handle) -> bool:
    """Whether ``path`` still names the file open as ``handle``."""
    try:
        return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


def is_locked(path: Path) -> bool:
    """Whether another process holds the lock on the file ``path`` now."""
    path = Path(path)
    if not path.exists():
        return False
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False
