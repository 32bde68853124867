"""The run folder: one run in it at a time, never two runs' files mixed, and where a resumed
run continues from.

A run folder holds :data:`RUN_FILES`. While a run trains, :func:`holding` keeps the folder's
lock (a second run into it is refused at once) and clears the temporary files a killed write
left. Without ``--resume`` a folder that holds a run is refused (:func:`refuse_existing_run`);
with it, :func:`resume_point` finds a finished run's metrics or an unfinished one's
``last.pt``, after checking that the folder's settings are the run's
(:func:`settings_differing`, all but :data:`NOT_COMPARED_ON_RESUME`). :func:`interruptible`
turns SIGTERM and SIGINT into a request to write ``last.pt`` at the end of the step.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from ..core import distributed
from ..errors import BarterError
from . import parallel
from .checkpoint_parts import check_resume_state
from .checkpoints import (RESUME_KEYS, RUN_KEYS, load_checkpoint, read_json, remove_temporary_files,
                          save_checkpoint)
from .locking import HeldLock, exclusive_lock
from .optimization import parameter_groups
from .run_config import RunConfig
from .trusted_folders import check_own_files, check_trusted_folder

#: what a run writes into its folder
RUN_FILES = ("best.pt", "last.pt", "metrics.json")
#: the lock file in a run folder (training.locking): one training process at a time
RUN_LOCK = ".barter-mini.lock"


#: the locks this process holds on run folders (:func:`holding`), by folder: every write into
#: a held folder first checks that its lock still guards it (:func:`check_still_held`)
_HELD: dict[Path, HeldLock] = {}


def check_still_held(folder: Path) -> None:
    """A one-line error if this process holds ``folder`` (:func:`holding`) but its lock file was
    deleted or replaced meanwhile (:meth:`~barter_mini.training.locking.HeldLock.check`)."""
    held = _HELD.get(Path(folder))
    if held is not None:
        held.check()


def write_checkpoint(path: Path, state: dict) -> None:
    """Rank 0 writes (atomically, once it checked that the folder's lock is still its own);
    every process waits until it has."""
    if distributed.is_main_process():
        check_still_held(Path(path).parent)
        save_checkpoint(path, state)
    parallel.barrier()


#: the settings a resumed run may change: where data lives, the device, the progress bar
NOT_COMPARED_ON_RESUME = ("progress", "data_root", "download", "device")


def settings_differing(saved: dict, now: dict) -> list[str]:
    """The settings of a run (``asdict`` of its validated config) that differ from a run
    folder's ``saved`` ones."""
    defaults = asdict(RunConfig())        # a setting added since the folder was written had its default
    return sorted(key for key in set(now) | set(saved)
                  if key not in NOT_COMPARED_ON_RESUME
                  and _comparable(saved.get(key, defaults.get(key))) != _comparable(now.get(key, defaults.get(key))))


def _comparable(value):
    return list(value) if isinstance(value, tuple) else value     # JSON and checkpoints keep tuples as lists


def resume_point(out: Path, run: RunConfig) -> tuple[dict | None, dict | None]:
    """(metrics of a finished run, ``last.pt`` of an unfinished one) in the folder ``out``;
    both None when it holds no run. A folder of another configuration is refused."""
    check_own_files(out, RUN_FILES, f"the run folder {out}")
    if (out / "metrics.json").is_file():
        metrics = read_json(out / "metrics.json")
        _check_same_run(out / "metrics.json", metrics.get("run", {}), run)
        return metrics, None
    if (out / "last.pt").is_file():
        checkpoint = load_checkpoint(out / "last.pt", keys=RESUME_KEYS, use="resuming the run (--resume)")
        check_resume_state(checkpoint, out / "last.pt",
                           lambda model: [group["params"] for group in parameter_groups(model, 0.0)])
        _check_same_run(out / "last.pt", checkpoint["run"], run)
        return None, checkpoint
    if (out / "best.pt").is_file():       # killed between the first best.pt and last.pt: start again
        _check_same_run(out / "best.pt", load_checkpoint(out / "best.pt", keys=RUN_KEYS, use="resuming the run")["run"], run)
    return None, None


def refuse_existing_run(out: Path) -> None:
    """A one-line error if ``out`` holds a run's files: without ``resume`` a run would mix its
    files with that run's (one run per folder)."""
    present = [name for name in RUN_FILES if (out / name).exists()]
    if present:
        raise BarterError(f"{out} already holds a run ({', '.join(present)}): continue it with --resume and "
                          "the same settings, or train into another --out (or delete that folder first)")


@contextmanager
def holding(out: Path):
    """Hold the run folder ``out`` for this process: created if missing, once neither it nor a
    folder or link on the way can be changed by another user
    (:mod:`~barter_mini.training.trusted_folders`); its lock (:data:`RUN_LOCK`, removed when the
    run ends; a second run into it is refused at once; every checkpoint write checks it is still
    there, :func:`check_still_held`) and the temporary files a killed write left there removed.
    Yields the path to the folder that the check walked (links resolved): the run writes there,
    whatever a link in ``out`` points to later.
    Under ``torchrun`` rank 0 holds it for all: only rank 0 writes; the others get ``out``."""
    if parallel.launch_rank() != 0:
        yield out
        return
    created = not out.exists()
    folder = check_trusted_folder(out, f"the run folder {out}", create=True)
    try:
        with exclusive_lock(folder / RUN_LOCK, f"run folder {out}", remove=True) as held:
            remove_temporary_files(folder, RUN_FILES)
            _HELD[folder] = held
            try:
                yield folder
            finally:
                _HELD.pop(folder, None)
    finally:
        if created:     # a run that wrote nothing (bad data, an error before its first epoch) leaves no folder
            with contextlib.suppress(OSError):
                folder.rmdir()


def _check_same_run(path: Path, saved: dict, run: RunConfig) -> None:
    now = asdict(run.validate())
    differing = settings_differing(saved, now)
    if differing:
        shown = ", ".join(f"{key} {saved.get(key)!r} there, {now.get(key)!r} here" for key in differing)
        raise BarterError(f"{path} is a run of other settings ({shown}): "
                          "give the same settings to resume it, or another --out")


@contextmanager
def interruptible():
    """SIGTERM (Slurm preemption, ``kill``) and SIGINT (Ctrl-C) set a flag instead of killing
    the process, so the trainer can write ``last.pt`` at the end of the step in progress.
    Yields the list the handler appends the signal number to; restores the old handlers.
    Outside the main thread, where Python cannot install handlers, signals act as before."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum))
                for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
