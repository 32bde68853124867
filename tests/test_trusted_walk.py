"""A trusted folder is the folder that was walked: links on the way are checked, and callers get the walked path.

The walk resolves the path itself, one name at a time, so a symbolic link is followed only
where its folder passed the rule and the link is this user's or root's; the path it returns is
the one it opened and checked, never a second resolution that a link flipped meanwhile could
send elsewhere; a folder removed under it is a one-line refusal naming it.
"""

import os
import sys
import threading
from pathlib import Path

import pytest

from barter_mini.errors import BarterError
from barter_mini.training.sweep import private_folder
from barter_mini.training.trusted_folders import MAX_LINKS, check_trusted_folder, walk_trusted_folder

#: another user: ``nobody`` on Debian
OTHER_UID = 65534


def folder(path: Path, mode: int) -> Path:
    path.mkdir()
    path.chmod(mode)
    return path


def refusal(call, *args, **kwargs) -> str:
    """The message of the one-line :class:`BarterError` that ``call`` raises."""
    with pytest.raises(BarterError) as refused:
        call(*args, **kwargs)
    message = str(refused.value)
    assert "\n" not in message
    return message


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_link_in_a_folder_others_may_write_is_refused(tmp_path):
    """Whoever can write the link's folder can point the link at a folder of theirs."""
    private = folder(tmp_path / "private", 0o700)
    shared = folder(tmp_path / "shared", 0o777)
    (shared / "logs").symlink_to(private, target_is_directory=True)
    message = refusal(check_trusted_folder, shared / "logs", "the run cache")
    assert f"the folder above it, {shared}, may be written by others (mode 0777)" in message
    assert f"the folder above it, {shared}, may be written by others" in refusal(private_folder, shared / "logs")


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's link needs root")
def test_a_link_another_user_owns_in_a_sticky_folder_is_refused_and_a_link_of_mine_there_followed(tmp_path):
    """In a sticky folder such as /tmp the link's owner can still replace it, so it must be mine (or root's)."""
    private = folder(tmp_path / "private", 0o700)
    sticky = folder(tmp_path / "scratch", 0o1777)
    theirs, mine = sticky / "theirs", sticky / "mine"
    theirs.symlink_to(private, target_is_directory=True)
    os.lchown(theirs, OTHER_UID, OTHER_UID)
    mine.symlink_to(private, target_is_directory=True)
    message = refusal(private_folder, theirs)
    assert f"the symbolic link {theirs} on the way belongs to another user" in message
    message = refusal(check_trusted_folder, theirs / "cache", "the run cache")
    assert message.startswith(f"the run cache: the symbolic link {theirs} on the way belongs to another user")
    assert not (private / "cache").exists()
    assert private_folder(mine) == private
    assert check_trusted_folder(mine / "cache", "the run cache", create=True) == private / "cache"


def test_the_walk_resolves_links_dots_and_relative_paths_itself(tmp_path, monkeypatch):
    private = folder(tmp_path / "private", 0o700)
    (private / "inner").mkdir()
    (tmp_path / "relative").symlink_to("private/inner")
    (private / "up").symlink_to("..")
    (tmp_path / "loop-a").symlink_to("loop-b")
    (tmp_path / "loop-b").symlink_to("loop-a")
    before = open_descriptors()
    assert check_trusted_folder(tmp_path / "relative", "the folder") == private / "inner"
    assert check_trusted_folder(tmp_path / "relative" / ".." / "up" / "private", "the folder") == private
    assert check_trusted_folder(f"{tmp_path}//private/./inner/", "the folder") == private / "inner"
    monkeypatch.chdir(private / "inner")
    assert check_trusted_folder("../../relative", "the folder") == private / "inner"
    walked = walk_trusted_folder("..", "the folder")
    try:
        assert walked.path == private and os.path.samestat(os.fstat(walked.fd), private.stat())
    finally:
        os.close(walked.fd)
    assert f"more than {MAX_LINKS} symbolic links" in refusal(check_trusted_folder, tmp_path / "loop-a", "the folder")
    missing = walk_trusted_folder(tmp_path / "relative" / "new" / "logs", "the folder")
    assert missing == (-1, private / "inner" / "new" / "logs")
    assert open_descriptors() == before


def test_the_path_returned_is_the_folder_the_walk_checked_while_a_link_flips(tmp_path):
    """A racer flips ``current`` between a private folder and one others may write. The walk
    refuses the shared folder or returns the private one by its own path: a path resolved again
    after the check (through ``current``) would often name the shared folder instead."""
    private = folder(tmp_path / "private", 0o700)
    shared = folder(tmp_path / "shared", 0o777)
    current = tmp_path / "current"
    current.symlink_to("private")
    assert private_folder(current) == private
    flips, done = [0], threading.Event()

    def flip():
        while not done.is_set():
            os.symlink("shared" if flips[0] % 2 == 0 else "private", tmp_path / "next")
            os.rename(tmp_path / "next", current)
            flips[0] += 1

    racer = threading.Thread(target=flip)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)                 # interleave the racer with the walk as often as the GIL allows
    racer.start()
    returned, refused = [], 0
    try:
        for _ in range(2000):
            try:
                path = private_folder(current)
            except BarterError as error:
                assert "may be written by others (mode 0777)" in str(error)
                refused += 1
                continue
            returned.append((path, os.stat(path)))
    finally:
        done.set()
        racer.join()
        sys.setswitchinterval(switch)
    assert flips[0] > 0 and returned
    shared_folder = shared.stat()
    assert [path for path, found in returned if os.path.samestat(found, shared_folder)] == []
    assert {path for path, _ in returned} == {private}


def test_a_folder_removed_during_the_walk_is_one_line_naming_it(tmp_path, monkeypatch):
    parent = folder(tmp_path / "parent", 0o700)
    open_folder, make_folder = os.open, os.mkdir

    def remove_parent_first(name, flags, *args, dir_fd=None, **kwargs):
        if name == "logs" and parent.exists():
            parent.rmdir()
        return open_folder(name, flags, *args, dir_fd=dir_fd, **kwargs)

    monkeypatch.setattr(os, "open", remove_parent_first)
    assert f"({parent} was removed while the path was walked)" in refusal(private_folder, parent / "logs")
    monkeypatch.setattr(os, "open", open_folder)

    parent.mkdir(mode=0o700)

    def make_then_remove(name, mode=0o777, *, dir_fd=None):
        make_folder(name, mode, dir_fd=dir_fd)
        os.rmdir(name, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", make_then_remove)
    assert f"({parent / 'logs'} was removed while the path was walked)" in refusal(private_folder, parent / "logs")
    monkeypatch.setattr(os, "mkdir", make_folder)

    monkeypatch.chdir(parent)
    parent.rmdir()                              # the current folder, which a relative path starts from
    assert "the current folder cannot be read" in refusal(check_trusted_folder, "logs", "the run cache logs")
