"""Folders whose contents decide what runs: no other user may write them or a folder above them.

submitit's folder holds pickles that the sweep and its jobs unpickle; the run cache and a run
folder hold checkpoints that are resumed and metrics that the book reports. Whoever can write
such a folder can decide what the next user's process runs or reports, and so can whoever
can write any folder above it: they rename the checked folder away and put their own in its
place. So the rule (the one ``sshd`` applies to ``~/.ssh``) is checked on the whole path:

* every folder from the top down is owned by this user or by root;
* none may be written by another user: no write permission for others, and none for the group
  unless the group is the user's own private group (no other member: Debian's user private
  groups, where a umask of 002 is the default); an ancestor with the sticky bit, such as
  ``/tmp``, is accepted: there nobody renames or removes an entry they do not own;
* folders above the user's home folder are the administrator's and are not checked.

The walk opens each folder relative to the one above it (``openat`` with ``O_NOFOLLOW``), so
what is checked is what is opened, whatever is renamed meanwhile; :func:`open_trusted_folder`
returns the last descriptor for a caller that writes through it (export). Once the check
passes, no other user can rename anything along the path, so a path checked here names the
same folder afterwards. Refusals are one line naming the folder and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import shlex
import stat
from pathlib import Path

from ..errors import BarterError

#: how each folder of a path is opened: only as a folder, never through a link, without the
#: read permission a folder that is only searchable (``--x``) would refuse
OPEN_FLAGS = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)


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
        raise BarterError(f"{where} may be written by others (mode {mode:04o}), who could "
                          f"{'change what is inside' if is_target else 'rename what is inside and put their own in its place'}: "
                          f"make it private (chmod go-w {shlex.quote(str(folder))}) or use another folder")


def open_trusted_folder(path: str | Path, what: str, create: bool = False, private: bool = False,
                        trust: bool = True) -> int:
    """A descriptor (``O_PATH``) of the folder ``path``, links in the path resolved, once it and
    every folder above it passed the check in this module's docstring; the caller closes it.
    ``create``: make the missing folders (``0700`` if ``private``, else ``0755``: never
    writable by others, whatever the umask). ``private``: the folder must be this user's, not
    root's. ``what`` names the folder in refusals (``"the run cache /x ($BARTER_MINI_CACHE)"``).

    Without ``create`` a missing folder checks its nearest existing ancestor and returns -1:
    it will be made (by a call with ``create``) inside folders that passed. ``trust`` False
    skips the ownership and permission checks and only opens the folder the path names now,
    without following a link made in its place meanwhile (a folder to write one file into)."""
    target = Path(os.path.realpath(os.path.abspath(path)))
    home = _home()
    checked_from = home if home is not None and target.is_relative_to(home) else Path("/")
    mode = 0o700 if private else 0o755
    fd = os.open("/", OPEN_FLAGS)
    folder = Path("/")
    try:
        for index, name in enumerate(("", *target.parts[1:])):
            if name:
                folder = folder / name
                try:
                    child = os.open(name, OPEN_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        return -1
                    with contextlib.suppress(FileExistsError):      # made meanwhile: checked below like any
                        os.mkdir(name, mode, dir_fd=fd)
                    child = os.open(name, OPEN_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
            if trust and folder.is_relative_to(checked_from):
                _check(os.fstat(fd), folder, what, is_target=(folder == target), private=private)
        held, fd = fd, -1
        return held
    except OSError as error:
        if error.errno in (errno.ENOTDIR, errno.ELOOP) and folder == target:
            raise BarterError(f"{what} is not a folder: give a folder you own") from None
        reason = {errno.ENOTDIR: f"{folder} is not a folder", errno.ELOOP: f"{folder} was replaced by a link",
                  errno.EACCES: f"permission denied at {folder}", errno.ENAMETOOLONG: "the path is too long"}
        raise BarterError(f"{what}: cannot open or create it ({reason.get(error.errno, error.strerror or type(error).__name__)}): "
                          "give a folder you own") from None
    finally:
        if fd >= 0:
            os.close(fd)


def check_trusted_folder(path: str | Path, what: str, create: bool = False, private: bool = False) -> Path:
    """``path`` with its links resolved, once :func:`open_trusted_folder` passed it (created
    where ``create``)."""
    fd = open_trusted_folder(path, what, create=create, private=private)
    if fd >= 0:
        os.close(fd)
    return Path(os.path.realpath(os.path.abspath(path)))


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
            raise BarterError(f"{path} in {what} is {'a symbolic link' if stat.S_ISLNK(found.st_mode) else 'not a regular file'}, "
                              "not a file a run wrote: refused; delete it and ask again")
        if found.st_uid != me:
            raise BarterError(f"{path} in {what} was written by another user ({_owner(found.st_uid)}): refused, "
                              "since a run resumes and reports only what it wrote itself; delete it and ask again")
