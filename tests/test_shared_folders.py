"""Shared machines: no folder another user can write decides what runs or what the book reports.

Each test reproduces one probe of an adversarial review (it failed before the fix): submitit's
folder renamed from a folder above it, a cache others may write, a partial run planted by
another user, an entry linked or copied under another run's name, an ``--init`` file replaced
under a cache folder's name, an export folder flipped to a link, a run lock deleted mid-run,
and a last update that broke the weights. The two-user probes make the other user's files
with ``chown`` or run a child as ``nobody``; they are skipped where this process cannot.
"""

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest

import barter_mini.training.cache as cache
import barter_mini.training.export as export
import barter_mini.training.trainer as trainer
from barter_mini.errors import DIVERGED_STATUS, BarterError
from barter_mini.training.locking import exclusive_lock
from barter_mini.training.run_folder import RUN_LOCK
from barter_mini.training.sweep import ExecutorSettings, default_logs, make_executor, private_folder
from barter_mini.training.trainer import RunConfig
from barter_mini.training import trusted_folders
from barter_mini.training.trusted_folders import check_trusted_folder, open_trusted_folder

from test_adversarial import SMOKE, finished_run, one_line, run_cli

#: another user: ``nobody`` on Debian
OTHER_UID = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making another user's files needs root")
SWEEP = ["sweep", "--methods", "static", "--densities", "0.5", "--seeds", "0", "--model", "vit-mini",
         "--dataset", "digits", "--recipe", "smoke", "--epochs", "1"]


def smoke_run(**changes) -> RunConfig:
    return RunConfig(**{"method": "static", "model": "vit-mini", "dataset": "digits", "density": 0.5, "seed": 0,
                        "recipe": "smoke", "epochs": 1, "progress": False, **changes})


def fake_entry(run: RunConfig, cache_dir: Path, test_acc: float) -> Path:
    """A complete cache entry of ``run`` with ``test_acc``, without training it."""
    target = cache.run_dir(run.validate(), cache_dir)
    target.mkdir(parents=True)
    (target / "metrics.json").write_text(json.dumps({"test_acc": test_acc, "run": asdict(run.validate())}))
    cache.write_completion_record(target, target.name)
    return target


def shared_folder(path: Path, mode: int) -> Path:
    """A folder of ``mode``; where the group may write, the group is one with other members
    (``nogroup``, which is ``nobody``'s), since a user's private group is the user alone."""
    path.mkdir(parents=True, exist_ok=True)
    if mode & 0o020:
        if os.geteuid() != 0:
            pytest.skip("giving a folder to a shared group needs root")
        os.chown(path, -1, OTHER_UID)
    path.chmod(mode)
    return path


# ----------------------------------------------------------------------------- critical: submitit's folder

def test_a_log_folder_inside_a_folder_others_may_write_is_refused(tmp_path, capsys):
    """The probe renamed a private --logs folder from its group-writable parent after the check
    and had its own pickles unpickled as root: the parent must be checked too."""
    runs = shared_folder(tmp_path / "runs", 0o775)
    logs = runs / "sweep-logs"
    logs.mkdir(mode=0o700)
    status, err = run_cli([*SWEEP, "--logs", logs, "--cache-dir", tmp_path / "cache"], capsys)
    line = one_line(err)
    assert status == 2 and f"the folder above it, {runs}, may be written by others (mode 0775)" in line
    assert "chmod go-w" in line and list(logs.iterdir()) == []
    with pytest.raises(BarterError, match="the folder above it"):
        private_folder(runs / "new-logs")                 # not even created there
    assert not (runs / "new-logs").exists()


@needs_root
def test_another_user_can_rename_a_checked_folder_only_where_the_check_refuses():
    """What the check stands on, shown as the other user: from a world-writable parent they
    swap the folder; from a sticky one (/tmp's mode) they cannot, so that parent passes."""
    base = Path(tempfile.mkdtemp(dir="/tmp"))         # pytest's own folders are closed to other users
    try:
        base.chmod(0o755)
        for mode, swapped in ((0o777, True), (0o1777, False)):
            parent = shared_folder(base / f"parent-{mode:o}", mode)
            logs = parent / "logs"
            logs.mkdir(mode=0o700)
            rename = subprocess.run(["/bin/sh", "-c", 'mv "$1" "$1.old" && mkdir "$1"', "sh", str(logs)],
                                    user=OTHER_UID, group=OTHER_UID, extra_groups=[], capture_output=True)
            assert (rename.returncode == 0) == swapped, rename.stderr
            assert (logs.stat().st_uid == OTHER_UID) == swapped
            if swapped:
                with pytest.raises(BarterError, match="may be written by others"):
                    private_folder(logs)
            else:
                assert private_folder(logs) == logs.resolve()
    finally:
        shutil.rmtree(base)


def test_a_folder_writable_by_the_users_own_private_group_is_accepted(tmp_path):
    """Debian's user private groups (umask 002): group write is the user's alone there."""
    private = tmp_path / "umask-002"
    private.mkdir(mode=0o775)
    private.chmod(0o775)
    if not trusted_folders._group_is_mine_alone(private.stat().st_gid):
        pytest.skip("this user's group has other members here")
    assert private_folder(private / "logs") == (private / "logs").resolve()
    assert check_trusted_folder(private, "the run cache") == private.resolve()


def test_a_sticky_folder_is_accepted_above_the_logs_but_not_as_them(tmp_path):
    sticky = shared_folder(tmp_path / "scratch", 0o1777)
    assert private_folder(sticky / "mine") == (sticky / "mine").resolve()
    assert stat.S_IMODE((sticky / "mine").stat().st_mode) == 0o700
    with pytest.raises(BarterError, match=r"may be written by others \(mode 1777\)"):
        private_folder(sticky)


def test_submitits_pickles_default_to_a_private_folder_of_the_user_not_beside_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_logs() == tmp_path / "xdg" / "barter-mini" / "sweep-logs"
    assert ExecutorSettings().logs == default_logs()
    make_executor(ExecutorSettings())
    assert stat.S_IMODE(default_logs().stat().st_mode) == 0o700
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")        # not absolute: the spec says ignore it
    assert default_logs() == Path.home() / ".cache" / "barter-mini" / "sweep-logs"


def test_the_check_holds_each_folder_open_as_it_walks(tmp_path):
    """A folder swapped for a link between resolving the path and opening it is not followed."""
    real = tmp_path / "real"
    real.mkdir()
    fd = open_trusted_folder(real, "the folder")
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(real))
    finally:
        os.close(fd)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    assert check_trusted_folder(tmp_path / "link", "the folder") == (tmp_path / "elsewhere").resolve()


# ----------------------------------------------------------------------------- high: a cache others may write

@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o770])
def test_a_cache_others_may_write_is_refused_before_anything_is_read(tmp_path, capsys, monkeypatch, mode):
    shared = shared_folder(tmp_path / "shared-cache", mode)
    monkeypatch.setenv(cache.CACHE_ENV, str(shared))
    with pytest.raises(BarterError, match=rf"the run cache {shared} \(\$BARTER_MINI_CACHE\) may be written by others"):
        cache.cached_train(smoke_run())
    with pytest.raises(BarterError, match="may be written by others"):
        cache.cached_metrics(smoke_run())
    status, err = run_cli([*SWEEP, "--logs", tmp_path / "logs"], capsys)
    assert status == 2 and f"may be written by others (mode {mode:04o})" in one_line(err)
    assert list(shared.iterdir()) == []


@needs_root
def test_a_partial_run_planted_by_another_user_is_never_resumed(tmp_path, monkeypatch):
    """The probe planted a finished run with zeroed head weights as ``.NAME.partial``; it was
    resumed, finalized and vouched for. Another user's partial folder, or a file of theirs in
    one of ours, is refused and left as it is."""
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    target = cache.run_dir(smoke_run().validate(), cache_dir)
    trained = []
    monkeypatch.setattr(cache, "train", lambda *args, **kwargs: trained.append(args))
    for planted_folder in (True, False):
        partial = cache.partial_dir(target)
        partial.mkdir()
        (partial / "last.pt").write_bytes(b"another user's checkpoint")
        os.chown(partial / "last.pt", OTHER_UID, OTHER_UID)
        if planted_folder:
            os.chown(partial, OTHER_UID, OTHER_UID)
        with pytest.raises(BarterError, match="another user") as refused:
            cache.cached_train(smoke_run(), cache_dir)
        assert "\n" not in str(refused.value) and str(partial) in str(refused.value)
        assert (partial / "last.pt").read_bytes() == b"another user's checkpoint" and trained == []
        shutil.rmtree(partial)
    assert not target.exists()


@needs_root
def test_a_run_folder_with_another_users_checkpoint_is_not_resumed(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "last.pt").write_bytes(b"planted")
    os.chown(out / "last.pt", OTHER_UID, OTHER_UID)
    status, err = run_cli(["train", "--method", "static", *SMOKE, "--resume", "--out", out], capsys)
    assert status == 2 and "was written by another user" in one_line(err)
    assert (out / "last.pt").read_bytes() == b"planted"


# ----------------------------------------------------------------------------- medium: the wrong run's numbers

def test_an_entry_linked_to_another_entry_is_not_served(tmp_path, capsys):
    """The probe linked BARTER seed 1's entry to Static seed 0's and got Static's metrics back."""
    cache_dir = tmp_path / "cache"
    static = fake_entry(smoke_run(), cache_dir, 0.31)
    wanted = smoke_run(method="barter", seed=1)
    linked = cache.run_dir(wanted.validate(), cache_dir)
    linked.symlink_to(static, target_is_directory=True)
    assert cache.entry_state(linked) == ("damaged", "it is a symbolic link, not a folder the cache made")
    assert cache.cached_metrics(wanted, cache_dir) is None
    with pytest.raises(BarterError, match="is a symbolic link"):
        cache.cached_train(wanted, cache_dir)
    assert cache.cached_metrics(smoke_run(), cache_dir)["test_acc"] == 0.31       # the real entry still serves


def test_an_entry_copied_under_another_runs_name_is_damaged_and_trained_again(tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    static = fake_entry(smoke_run(), cache_dir, 0.31)
    wanted = smoke_run(method="barter", seed=1)
    copied = cache.run_dir(wanted.validate(), cache_dir)
    shutil.copytree(static, copied)
    assert cache.entry_state(copied, wanted) == ("damaged", f"complete.json is the record of another run ({static.name!r})")
    cache.write_completion_record(copied, copied.name)            # a record rewritten for its new name
    state, why = cache.entry_state(copied, wanted)
    assert state == "damaged" and why.startswith("metrics.json records another run (method 'static' there, 'barter' here")
    assert cache.cached_metrics(wanted, cache_dir) is None

    def trains(run, out, resume, checkpoint_every):
        out.mkdir(parents=True)
        (out / "metrics.json").write_text(json.dumps({"test_acc": 0.5, "run": asdict(run.validate())}))

    monkeypatch.setattr(cache, "train", trains)
    assert cache.cached_train(wanted, cache_dir)["test_acc"] == 0.5      # trained again, not 0.31
    assert cache.entry_state(copied, wanted) == ("complete", None)


def test_an_init_file_replaced_under_a_cache_folders_name_trains_afresh(tmp_path):
    """The key named a checkpoint inside a folder called ``*-<16 hex>`` by the folder's name:
    replacing the file brought the old metrics back."""
    init = tmp_path / "dense-vit-mini-digits-rho1-seed0-0123456789abcdef" / "best.pt"
    init.parent.mkdir()
    init.write_bytes(b"the weights the run was trained from")
    before = cache.run_key(smoke_run(method="barter", init=str(init)))
    init.write_bytes(b"other weights")
    assert cache.run_key(smoke_run(method="barter", init=str(init))) != before


# ----------------------------------------------------------------------------- low-medium: export, the lock, the last update

def test_export_writes_into_the_folder_it_checked_when_the_path_is_flipped_to_the_run(tmp_path, capsys, monkeypatch):
    """The probe turned --out's folder into a link to the run folder between the check and the
    write, and the run's best.pt was replaced on the first try."""
    run = finished_run(tmp_path / "run")
    before = {path.name: path.read_bytes() for path in run.iterdir()}
    outbox = tmp_path / "outbox"
    outbox.mkdir()
    load = export.load_checkpoint

    def flip_then_load(*args, **kwargs):
        outbox.rename(tmp_path / "outbox-checked")
        outbox.symlink_to(run, target_is_directory=True)
        return load(*args, **kwargs)

    monkeypatch.setattr(export, "load_checkpoint", flip_then_load)
    status, err = run_cli(["export", run, "--out", outbox / "best.pt"], capsys)
    assert status == 0, err
    assert {path.name: path.read_bytes() for path in run.iterdir()} == before
    assert (tmp_path / "outbox-checked" / "best.pt").is_file()         # where the checked folder went


def test_a_deleted_run_lock_stops_the_run_before_it_writes_again(tmp_path, capsys, monkeypatch):
    """A deleted lock let a second --resume run train in the same folder, and the first then
    unlinked the second's lock."""
    out = tmp_path / "run"
    fit = trainer.fit_one_epoch

    def fit_then_lose_the_lock(t, *args, **kwargs):
        entry = fit(t, *args, **kwargs)
        if t.progress.epoch == 2:                    # epoch 1 written: someone deletes the lock
            (out / RUN_LOCK).unlink()
        return entry

    monkeypatch.setattr(trainer, "fit_one_epoch", fit_then_lose_the_lock)
    status, err = run_cli(["train", "--method", "static", *SMOKE, "--epochs", "3", "--out", out], capsys)
    assert status == 2 and "was deleted or replaced while this process held it" in one_line(err)
    assert not (out / "metrics.json").exists()


def test_a_lock_file_replaced_by_another_process_is_left_to_it(tmp_path):
    lock = tmp_path / "run.lock"
    with exclusive_lock(lock, "run x", remove=True) as first:
        lock.unlink()
        with exclusive_lock(lock, "run x", remove=True) as second:
            assert not first.still_named() and second.still_named()
            with pytest.raises(BarterError, match="was deleted or replaced"):
                first.check()
            inode = lock.stat().st_ino
        lock.touch()                                  # a third process's lock meanwhile
        inode = lock.stat().st_ino
    assert lock.stat().st_ino == inode                # the first did not unlink it


def test_a_run_whose_last_update_broke_the_weights_diverges(tmp_path, capsys):
    """A 1-step run at --lr 1e30 exited 0 with weights near 1e30: the loss of a step is read
    before its update, so the last update was never checked."""
    out = tmp_path / "one-step"
    status, err = run_cli(["train", "--method", "static", *SMOKE, "--epochs", "1", "--train-subset", "64",
                           "--lr", "1e30", "--out", out], capsys)
    line = one_line(err, "diverged: ")
    assert status == DIVERGED_STATUS and "the validation loss after step 1" in line
    assert not (out / "metrics.json").exists()


def test_export_onto_a_full_device_is_one_line_and_leaves_no_temporary_file(tmp_path, capsys, monkeypatch):
    run = finished_run(tmp_path / "run")
    outbox = tmp_path / "outbox"
    outbox.mkdir()

    def full(obj, f, *args, **kwargs):
        f.write(b"PK")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(export.torch, "save", full)
    status, err = run_cli(["export", run, "--out", outbox / "model.pt"], capsys)
    assert status == 2 and f"while writing {outbox / 'model.pt'}" in one_line(err) and "no space left on" in err
    assert list(outbox.iterdir()) == []
