"""Folders whose contents decide what runs: no other user may write them or a folder above them.

submitit's folder holds pickles that the sweep and its jobs unpickle; the run cache and a run
folder hold checkpoints that are resumed and metrics that the book reports. Whoever can write
such a folder can decide what the next user's process runs or reports, and so can whoever
can write any folder above it: they rename the checked folder away and put their own in its
place. So the rule (the one ``sshd`` applies to ``~/.ssh``) is checked on the whole path:

* every folder the walk goes through, from ``/`` down, is owned by this user or by root;
* none may be written by another user: no write permission for others, and none for the group
  unless the group is the user's own private group (no other member: Debian's user private
  groups, where a umask of 002 is the default); an ancestor with the sticky bit, such as
  ``/tmp``, is accepted: there nobody renames or removes an entry they do not own;
* a symbolic link on the way is followed only where its folder passed the rule and the link
  belongs to this user or to root: anyone else could replace it, even in a sticky folder,
  with one that points elsewhere;
* folders above the user's home folder are the administrator's and are not checked when the
  walk ends inside the home folder.

The path is resolved by the walk itself, one name at a time from ``/`` (a relative path from
the current folder): each folder is opened relative to the one above it (``openat`` with
``O_NOFOLLOW``) and checked while it is held open, ``..`` goes back to the folder the walk came
from, and a link's target is walked the same way (from ``/`` or from the link's folder), at
most :data:`MAX_LINKS` links. So what is checked is what is opened, whatever is renamed
meanwhile, and the walk returns the path it took (:class:`WalkedFolder`): the links resolved,
the folders that passed. Once the check passes, no other user can rename anything along that
path, so it names the same folder afterwards, which the path as given (through a link) need
not; callers use the walked path from then on. :func:`open_trusted_folder` returns the last
descriptor for a caller that writes through it (export). Refusals are one line naming the
folder and what to do, a folder or link removed or replaced while the walk passes it included.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import shlex
import stat
from collections import deque
from pathlib import Path
from typing import NamedTuple

from ..errors import BarterError

#: how each folder of a path is opened: only as a folder, never through a link, without the
#: read permission a folder that is only searchable (``--x``) would refuse
OPEN_FLAGS = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)

#: symbolic links one walk follows before it stops as on a loop (the kernel's own limit)
MAX_LINKS = 40


def _home() -> Path | None:
    try:
        return Path(os.path.realpath(pwd.getpwuid(os.geteuid()).pw_dir))
    except (KeyError, OSError):
        return None


def _group_is_mine_alone(gid: int) -> bool:
    """Whether the group ``gid`` has no member but this user (as supplementary member or as
    another account's primary group): then its write permission is this user's own."""
    me = os.geteuid()
    try:
        group, name = grp.getgrgid(gid), pwd.getpwuid(me).pw_name
    except KeyError:
        return False
    return all(member == name for member in group.gr_mem) and \
        all(user.pw_uid == me for user in pwd.getpwall() if user.pw_gid == gid)


def _writable_by_others(found: os.stat_result) -> bool:
    return bool(found.st_mode & 0o002 or (found.st_mode & 0o020 and not _group_is_mine_alone(found.st_gid)))


def _owner(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"user id {uid}"


def _check(found: os.stat_result, folder: Path, what: str, is_target: bool, private: bool) -> None:
    """A one-line error unless ``folder`` (``found`` its status) may be trusted as
    ``is_target`` (the folder asked for) or as a folder above it."""
    me = os.geteuid()
    trusted_owners = (me,) if is_target and private else (me, 0)
    where = what if is_target else f"{what}: the folder above it, {folder},"
    if found.st_uid not in trusted_owners:
        raise BarterError(f"{where} belongs to another user ({_owner(found.st_uid)}), who could replace what "
                          "is inside: use a folder of your own (copy what you need into it)")
    if _writable_by_others(found) and (is_target or not found.st_mode & stat.S_ISVTX):
        mode = stat.S_IMODE(found.st_mode)
        could = "change what is inside" if is_target else "rename what is inside and put their own in its place"
        raise BarterError(f"{where} may be written by others (mode {mode:04o}), who could {could}: "
                          f"make it private (chmod go-w {shlex.quote(str(folder))}) or use another folder")


class WalkedFolder(NamedTuple):
    """What :func:`walk_trusted_folder` found: the descriptor (``O_PATH``) of the folder, -1
    where it is missing, and the absolute path the walk took to it, links resolved (for a
    missing folder: the path to its nearest existing ancestor and the names still to make)."""
    fd: int
    path: Path


def _names(path: str) -> list[str]:
    """The names the walk goes through for ``path``: an empty name (``a//b``, a trailing
    ``/``) and ``.`` stay in the same folder."""
    return [name for name in path.split("/") if name not in ("", ".")]


def walk_trusted_folder(path: str | Path, what: str, create: bool = False, private: bool = False,
                        trust: bool = True) -> WalkedFolder:
    """The folder ``path`` opened by the walk of this module's docstring, once it and every
    folder and link the walk went through passed the rule there; the caller closes the
    descriptor. ``create``: make the missing folders (``0700`` if ``private``, else ``0755``:
    never writable by others, whatever the umask). ``private``: the folder must be this
    user's, not root's. ``what`` names the folder in refusals (``"the run cache /x
    ($BARTER_MINI_CACHE)"``).

    Without ``create`` a missing folder checks its nearest existing ancestor and gives the
    descriptor -1: it will be made (by a call with ``create``) inside folders that passed.
    ``trust`` False skips the ownership and permission checks (a link is followed whoever owns
    it) and only opens the folder the path names now: a link put in its place afterwards is
    not followed (a folder to write one file into)."""
    given = os.fspath(path)
    if "\0" in given:
        raise BarterError(f"{what}: the path holds a NUL character, which no file name can: give a folder's path")
    if not given.startswith("/"):
        try:
            given = f"{os.getcwd()}/{given}"
        except OSError as error:
            raise BarterError(f"{what}: a relative path, but the current folder cannot be read "
                              f"({error.strerror or type(error).__name__}): give an absolute path") from None
    walk = _Walk(what, create, private, trust)
    try:
        return walk.run(_names(given))
    finally:
        walk.close()


class _Walk:
    """One walk of :func:`walk_trusted_folder`: the folders held open from ``/`` down to where
    the walk is, and the refusals of folders above the home folder, which count only where the
    walk ends outside it."""

    def __init__(self, what: str, create: bool, private: bool, trust: bool):
        self.what, self.create, self.private, self.trust = what, create, private, trust
        self.home = _home()
        self.held: list[tuple[int, Path]] = []      # ("/", its descriptor) first, the folder the walk is in last
        self.above_home_refusal: BarterError | None = None
        self.links = 0
        self.at = Path("/")                          # the name being opened, for the refusal if it fails

    def close(self) -> None:
        while self.held:
            os.close(self.held.pop()[0])

    def run(self, names: list[str]) -> WalkedFolder:
        pending = deque(names)
        try:
            self.held.append((os.open("/", OPEN_FLAGS), Path("/")))
            self._check_folder(is_target=not pending)
            target_checked = not pending
            while pending:
                name = pending.popleft()
                fd, folder = self.held[-1]
                if name == "..":
                    if len(self.held) > 1:
                        os.close(self.held.pop()[0])
                    target_checked = False
                    continue
                self.at = folder / name
                opened = self._open(fd, folder, name)
                if opened is None:
                    missing = self.at.joinpath(*pending)
                    self._settle(missing)
                    return WalkedFolder(-1, missing)
                if isinstance(opened, str):           # a link that passed: its target replaces its name
                    if opened.startswith("/"):
                        while len(self.held) > 1:
                            os.close(self.held.pop()[0])
                    pending.extendleft(reversed(_names(opened)))
                    target_checked = False
                    continue
                self.held.append((opened, self.at))
                self._check_folder(is_target=not pending)
                target_checked = not pending
            if not target_checked:                      # the walk ended on a folder it passed on the way (``..``)
                self._check_folder(is_target=True)
        except OSError as error:
            raise self._refusal(error, is_target=not pending) from None
        fd, folder = self.held.pop()
        try:
            self._settle(folder)
        except BarterError:
            os.close(fd)
            raise
        return WalkedFolder(fd, folder)

    def _open(self, fd: int, folder: Path, name: str) -> int | str | None:
        """The descriptor of ``folder/name``, or the target of the link it is once that link
        passed, or None where it is missing and not to be made."""
        try:
            return os.open(name, OPEN_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not self.create:
                return None
        except OSError as error:
            if error.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            return self._link_target(fd, folder, name)
        if self.above_home_refusal is not None and self._above_home(folder):
            raise self.above_home_refusal              # nothing is made in a folder that did not pass
        try:
            os.mkdir(name, 0o700 if self.private else 0o755, dir_fd=fd)
        except FileExistsError:                         # made meanwhile: opened and checked like any
            pass
        except FileNotFoundError:                       # the name is one: its folder is what went
            self.at = folder
            raise
        try:
            return os.open(name, OPEN_FLAGS, dir_fd=fd)
        except OSError as error:
            if error.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            return self._link_target(fd, folder, name)

    def _link_target(self, fd: int, folder: Path, name: str) -> str:
        """The target of the link ``folder/name`` (``folder`` passed the rule when it was
        opened) once the link passed: it belongs to this user or root. Anything else that is
        not a folder is an :class:`OSError` (``ENOTDIR``, or ``ENOENT`` where it was removed)."""
        found = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(found.st_mode):                 # a link when opened, a folder now
            raise self._cannot(f"{self.at} was replaced while the path was walked")
        if not stat.S_ISLNK(found.st_mode):
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        self.links += 1
        if self.links > MAX_LINKS:
            raise BarterError(f"{self.what}: more than {MAX_LINKS} symbolic links on the way, the last {self.at} "
                              "(a loop?): give a path without a loop of links")
        if self.trust and found.st_uid not in (os.geteuid(), 0):
            self._refuse(BarterError(
                f"{self.what}: the symbolic link {self.at} on the way belongs to another user "
                f"({_owner(found.st_uid)}), who could replace it with one that points elsewhere: "
                "give the folder it points to, or a link of your own"), folder)
        return os.readlink(name, dir_fd=fd)

    def _check_folder(self, is_target: bool) -> None:
        """The rule of this module's docstring for the folder the walk is in."""
        fd, folder = self.held[-1]
        if self.trust:
            try:
                _check(os.fstat(fd), folder, self.what, is_target=is_target, private=self.private)
            except BarterError as refusal:
                self._refuse(refusal, folder)

    def _above_home(self, folder: Path) -> bool:
        return self.home is not None and folder != self.home and self.home.is_relative_to(folder)

    def _refuse(self, refusal: BarterError, folder: Path) -> None:
        """Raise ``refusal`` about ``folder`` now, or, for a folder above the home folder, keep
        it for :meth:`_settle`: those are the administrator's unless the walk ends outside home."""
        if not self._above_home(folder):
            raise refusal
        self.above_home_refusal = self.above_home_refusal or refusal

    def _settle(self, end: Path) -> None:
        inside_home = self.home is not None and ".." not in end.parts and end.is_relative_to(self.home)
        if self.above_home_refusal is not None and not inside_home:
            raise self.above_home_refusal

    def _refusal(self, error: OSError, is_target: bool) -> BarterError:
        """The one-line refusal for ``error``, met while opening :attr:`at`."""
        if error.errno == errno.ENOTDIR and is_target:
            return BarterError(f"{self.what} is not a folder: give a folder you own")
        reason = {errno.ENOTDIR: f"{self.at} is not a folder",
                  errno.ENOENT: f"{self.at} was removed while the path was walked",
                  errno.EACCES: f"permission denied at {self.at}",
                  errno.ENAMETOOLONG: "the path is too long"}
        return self._cannot(reason.get(error.errno, error.strerror or type(error).__name__))

    def _cannot(self, reason: str) -> BarterError:
        return BarterError(f"{self.what}: cannot open or create it ({reason}): give a folder you own")


def open_trusted_folder(path: str | Path, what: str, create: bool = False, private: bool = False,
                        trust: bool = True) -> int:
    """The descriptor of :func:`walk_trusted_folder`: -1 for a missing folder, else one the
    caller closes."""
    return walk_trusted_folder(path, what, create=create, private=private, trust=trust).fd


def check_trusted_folder(path: str | Path, what: str, create: bool = False, private: bool = False) -> Path:
    """The path :func:`walk_trusted_folder` took to ``path`` (created where ``create``), once it
    passed: the folder that was checked, whatever a link in ``path`` points to later."""
    walked = walk_trusted_folder(path, what, create=create, private=private)
    if walked.fd >= 0:
        os.close(walked.fd)
    return walked.path


def check_own_files(folder: Path, names, what: str) -> None:
    """A one-line error if a file among ``names`` in ``folder`` (one that exists) is not a
    regular file of this user's: a run resumes and reports only what it wrote itself."""
    me = os.geteuid()
    for name in names:
        path = Path(folder) / name
        try:
            found = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(found.st_mode) or not stat.S_ISREG(found.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(found.st_mode) else "not a regular file"
            raise BarterError(f"{path} in {what} is {kind}, not a file a run wrote: refused; delete it and ask again")
        if found.st_uid != me:
            raise BarterError(f"{path} in {what} was written by another user ({_owner(found.st_uid)}): refused, "
                              "since a run resumes and reports only what it wrote itself; delete it and ask again")
