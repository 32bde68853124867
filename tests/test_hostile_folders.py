"""Folders others may write, and resumes that would hide a divergence (issue 31, 1-4).

A shared run or cache folder must never make the next user's run write through a planted
link; submitit's folder, whose pickles the sweep reads, must be the user's alone; a run that
diverged stays diverged however often it is resumed; an export never replaces the run's own
files.
"""

import os
import stat
from pathlib import Path

import pytest

import barter_mini.training.cache as cache
from barter_mini.errors import DIVERGED_STATUS, BarterError
from barter_mini.training.checkpoints import load_checkpoint
from barter_mini.training.locking import exclusive_lock, is_locked
from barter_mini.training.run_folder import RUN_LOCK
from barter_mini.training.sweep import ExecutorSettings, make_executor, private_folder
from barter_mini.training.trainer import RunConfig

from test_adversarial import SMOKE, finished_run, one_line, run_cli

#: the attacker's target: a file the victim owns
KEEP = b"keep this file as it is\n"


def victim_file(tmp_path: Path) -> Path:
    target = tmp_path / "victim.txt"
    target.write_bytes(KEEP)
    return target


def cache_run() -> RunConfig:
    return RunConfig(method="static", model="vit-mini", dataset="digits", density=0.5, seed=0, recipe="smoke",
                     epochs=1, progress=False)


# ----------------------------------------------------------------------------- 1. planted lock files

def test_a_run_folder_lock_planted_as_a_link_leaves_its_target_unchanged(tmp_path, capsys):
    target, shared = victim_file(tmp_path), tmp_path / "shared"
    shared.mkdir()
    (shared / RUN_LOCK).symlink_to(target)
    status, err = run_cli(["train", "--method", "static", *SMOKE, "--resume", "--out", shared], capsys)
    assert status == 2 and "is a symbolic link" in one_line(err) and str(shared / RUN_LOCK) in err
    assert target.read_bytes() == KEEP
    assert sorted(path.name for path in shared.iterdir()) == [RUN_LOCK]     # nothing else written there


def test_a_cache_lock_planted_as_a_link_leaves_its_target_unchanged(tmp_path):
    target, cache_dir = victim_file(tmp_path), tmp_path / "cache"
    cache_dir.mkdir()
    entry = cache.run_dir(cache_run().validate(), cache_dir)
    cache.lock_path(entry).symlink_to(target)
    with pytest.raises(BarterError, match="is a symbolic link"):
        cache.cached_train(cache_run(), cache_dir)
    with pytest.raises(BarterError, match="is a symbolic link"):
        cache.run_is_locked(entry)                       # what the sweep asks before submitting
    assert target.read_bytes() == KEEP
    assert not entry.exists() and not cache.partial_dir(entry).exists()


def test_a_lock_that_is_a_hard_link_or_no_regular_file_is_refused(tmp_path):
    target = victim_file(tmp_path)
    os.link(target, tmp_path / "hard.lock")
    with pytest.raises(BarterError, match="has other hard links"):
        with exclusive_lock(tmp_path / "hard.lock", "run x"):
            pass
    assert target.read_bytes() == KEEP
    os.mkfifo(tmp_path / "fifo.lock")
    with pytest.raises(BarterError, match="is not a regular file"):
        with exclusive_lock(tmp_path / "fifo.lock", "run x"):
            pass


def test_a_holders_line_is_quoted_without_control_characters(tmp_path):
    lock = tmp_path / "run.lock"
    with exclusive_lock(lock, "run x"):
        lock.write_text("process 1 on \x1b[2Jhost\nsecond line\n")       # rewritten by someone else
        with pytest.raises(BarterError) as refused:
            with exclusive_lock(lock, "run x"):
                pass
        assert is_locked(lock)
    message = str(refused.value)
    assert "process 1 on [2Jhost" in message and "\x1b" not in message and "second line" not in message


def test_a_cache_entry_or_partial_folder_planted_as_a_link_is_refused(tmp_path):
    elsewhere, cache_dir = tmp_path / "victims-folder", tmp_path / "cache"
    elsewhere.mkdir()
    cache_dir.mkdir()
    entry = cache.run_dir(cache_run().validate(), cache_dir)
    cache.partial_dir(entry).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(BarterError, match=r"\.partial in the run cache is a symbolic link"):
        cache.cached_train(cache_run(), cache_dir)
    assert list(elsewhere.iterdir()) == []


# ----------------------------------------------------------------------------- 2. submitit's folder is private

def test_a_new_log_folder_is_private_whatever_the_umask(tmp_path):
    previous = os.umask(0)
    try:
        make_executor(ExecutorSettings(logs=tmp_path / "new" / "logs"))
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "new" / "logs").stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_log_folder_others_may_write_is_refused(tmp_path, capsys, mode):
    logs = tmp_path / "logs"
    logs.mkdir()
    if mode & 0o020:                      # a group with other members: a private group is the user alone
        if os.geteuid() != 0:
            pytest.skip("giving a folder to a shared group needs root")
        os.chown(logs, -1, 65534)
    logs.chmod(mode)
    status, err = run_cli(["sweep", "--methods", "static", "--densities", "0.5", "--seeds", "0", "--model",
                           "vit-mini", "--dataset", "digits", "--recipe", "smoke", "--epochs", "1",
                           "--logs", logs], capsys)
    assert status == 2 and f"may be written by others (mode {mode:04o})" in one_line(err)
    assert list(logs.iterdir()) == []                    # no job was submitted into it


def test_a_log_folder_of_another_user_or_no_folder_is_refused(tmp_path, capsys, monkeypatch):
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: logs.stat().st_uid + 1)
    with pytest.raises(BarterError, match="belongs to another user"):
        private_folder(logs)
    monkeypatch.undo()
    status, err = run_cli(["sweep", "--methods", "static", "--densities", "0.5", "--seeds", "0", "--model",
                           "vit-mini", "--dataset", "digits", "--recipe", "smoke", "--epochs", "1",
                           "--logs", "/etc/passwd"], capsys)
    assert status == 2 and "/etc/passwd (--logs) is not a folder" in one_line(err)


# ----------------------------------------------------------------------------- 3. a divergence stays

def test_a_diverged_run_stays_diverged_however_often_it_is_resumed(tmp_path, capsys):
    out = tmp_path / "d2"
    argv = ["train", "--method", "static", *SMOKE, "--epochs", "3", "--lr", "10", "--resume", "--out", out]
    status, err = run_cli(argv, capsys)
    first = one_line(err, "diverged: ")
    assert status == DIVERGED_STATUS
    for _ in range(4):
        status, err = run_cli(argv, capsys)
        assert (status, one_line(err, "diverged: ")) == (DIVERGED_STATUS, first)
    assert not (out / "metrics.json").exists()
    assert load_checkpoint(out / "last.pt")["diverged"]["what"] in first


def test_a_run_shorter_than_one_curve_point_is_checked_before_it_writes(tmp_path, capsys):
    out = tmp_path / "short"
    status, err = run_cli(["train", "--method", "static", *SMOKE, "--epochs", "1", "--train-subset", "320",
                           "--lr", "10", "--out", out], capsys)      # 5 steps: no curve point, no periodic check
    assert status == DIVERGED_STATUS
    line = one_line(err, "diverged: ")
    assert "step 5: the training loss averaged" in line and "over steps 1-5" in line
    assert not (out / "metrics.json").exists() and not (out / "best.pt").exists()


# ----------------------------------------------------------------------------- 4. export over the run's files

@pytest.mark.parametrize("name", ["best.pt", "last.pt", "metrics.json"])
def test_export_over_the_runs_own_files_is_refused(tmp_path, capsys, name):
    run = finished_run(tmp_path / "run")
    before = {path.name: path.read_bytes() for path in run.iterdir()}
    status, err = run_cli(["export", run, "--out", run / name], capsys)
    assert status == 2 and "is one of the run's own files" in one_line(err)
    (tmp_path / "alias.pt").symlink_to(run / name)                  # the same file by another name
    status, err = run_cli(["export", run, "--out", tmp_path / "alias.pt"], capsys)
    assert status == 2 and "is one of the run's own files" in one_line(err)
    assert {path.name: path.read_bytes() for path in run.iterdir()} == before
    assert run_cli(["export", run, "--out", tmp_path / "model.pt"], capsys)[0] == 0
