"""One process at a time in a run folder or a cache entry: an exclusive, non-blocking lock.

``fcntl.flock`` on a small lock file: the kernel releases it when its holder exits, however
it exits (a SIGKILL included), so a killed run never leaves a stale lock; on NFS, Linux maps
it to a POSIX lock that the server arbitrates across nodes. A second process is refused at
once with a one-line :class:`~barter_mini.errors.BarterError` rather than made to wait, so a
duplicate job fails in seconds instead of holding a GPU for the length of a run. The file
records its holder (host and process) for that message.

A run or cache folder is refused where another user may write it
(:mod:`~barter_mini.training.trusted_folders`); the lock file is still opened as what it must
be and nothing else, for a folder that was writable once: ``O_NOFOLLOW`` refuses a symbolic link planted in its
place (following it would truncate and overwrite the link's target, any file the user owns),
and a file that is not a regular file of one link (a hard link to another file, a FIFO, a
device) is refused before a byte is written, in one line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
from pathlib import Path
from typing import Iterator

from ..errors import BarterError


class HeldLock:
    """The lock a process holds on the file ``path``; :meth:`check` says whether it still guards
    that path (nobody deleted or replaced the file since)."""

    def __init__(self, path: Path, handle, what: str):
        self.path, self.handle, self.what = path, handle, what

    def still_named(self) -> bool:
        return _names(self.path, self.handle)

    def check(self) -> None:
        """A one-line error if the lock file was deleted or replaced since it was taken: another
        process may then hold a lock of its own on the new file and write into the same folder,
        so this one stops before it writes."""
        if not self.still_named():
            raise BarterError(f"the lock file {self.path} of {self.what} was deleted or replaced while this "
                              "process held it, so another process may be writing there too: stopped before "
                              "writing; the files written before are intact, continue with --resume once "
                              "no other process trains there")


@contextlib.contextmanager
def exclusive_lock(path: Path, what: str, remove: bool = False) -> Iterator[HeldLock]:
    """Hold the lock on the file ``path`` (created if missing), or raise "``what`` is being
    trained by HOLDER" at once if another process holds it; yields a :class:`HeldLock`.
    ``remove``: delete the file when done, still holding the lock, if the path still names it
    (another process's lock file in its place is left alone); a process that opened it before
    then finds, once it has the lock, that the path no longer names its file, and opens the
    path afresh."""
    path = Path(path)
    while True:
        handle = _open(path)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = _printable(handle.read(HOLDER_CHARS).strip().splitlines()[:1]) or "another process"
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
        yield HeldLock(path, handle, what)
    finally:
        if remove and _names(path, handle):
            path.unlink(missing_ok=True)
        handle.close()


#: how a lock file is opened: created if missing, never through a symbolic link, never
#: blocking on a FIFO, closed in child processes (a job's subprocesses must not hold it)
OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _open(path: Path):
    """The lock file ``path`` opened for reading and writing, if it is a regular file of one
    link (created so if missing), else a one-line error: nothing is written to anything else."""
    try:
        fd = os.open(path, OPEN_FLAGS, 0o666)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise BarterError(f"the lock file {path} is a symbolic link: refused, since writing through it "
                              "would overwrite its target; delete the link (someone who can write that "
                              "folder planted it) and ask again") from None
        raise BarterError(f"cannot create the lock file {path} ({error.strerror or type(error).__name__}): "
                          "choose a folder you may write in") from None
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
        os.close(fd)
        what = "has other hard links" if stat.S_ISREG(found.st_mode) else "is not a regular file"
        raise BarterError(f"the lock file {path} {what}: refused, since writing to it would change another "
                          "file; delete it and ask again")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "r+")


#: how much of a lock file's holder line the refusal quotes
HOLDER_CHARS = 200


def _printable(lines: list[str]) -> str:
    """The holder line without control characters: the file is in a folder others may write."""
    return "".join(char for char in (lines[0] if lines else "") if char.isprintable())


def _names(path: Path, handle) -> bool:
    """Whether ``path`` still names the file open as ``handle``."""
    try:
        found, held = os.lstat(path), os.fstat(handle.fileno())
        return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)
    except FileNotFoundError:
        return False


def is_locked(path: Path) -> bool:
    """Whether another process holds the lock on the file ``path`` now."""
    path = Path(path)
    if not path.exists():
        return False
    with _open(path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False
