"""Training runs cached by their full configuration.

Notebooks share runs and rebuilding the book does not retrain what it already has. The
key is a hash of the run's configuration, the package version and a digest of the package
source that affects training; any change to either trains afresh.

A run trains into a hidden partial folder beside its cache folder (``.NAME.partial``) with
:func:`~barter_mini.training.trainer.train`'s ``resume=True`` and is renamed into place only
when complete, so the cache never holds half a run and an interrupted run (a killed process,
a preempted cluster job) continues from its ``last.pt`` the next time it is asked for. One
process at a time trains a partial folder: a second one is refused at once with a
:class:`~barter_mini.errors.BarterError` rather than made to wait, so a duplicate cluster job
fails in seconds instead of holding a GPU for the length of a run (:func:`run_lock`).

``BARTER_MINI_TRAIN=0`` (or ``cached_train(..., train_missing=False)``) makes the cache
read-only: a run it does not hold is a one-line error naming the run and the
``barter-mini sweep`` command that trains it, so a book can be rendered from runs computed
elsewhere (a cluster) without training anything by accident.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

from ..errors import BarterError
from ..version import __version__
from .checkpoints import read_json
from .trainer import RunConfig, train

PACKAGE = Path(__file__).resolve().parents[1]
#: the layers whose source determines what a training run produces (measurement, the book
#: and the command line do not)
TRAINING_LAYERS = ("core", "masked", "training")
#: modules of those layers that decide where and when runs train, not what they produce:
#: editing them must not invalidate a cache (or a cluster's worth of sweep results)
ORCHESTRATION_MODULES = ("training/cache.py", "training/sweep.py")
#: the environment variable that, set to 0, makes :func:`cached_train` read-only
TRAIN_ENV = "BARTER_MINI_TRAIN"
#: a cache folder's name ends with its 16-hex-digit key (:func:`run_dir`)
CACHE_FOLDER_NAME = re.compile(r".+-[0-9a-f]{16}$")


def default_cache_dir() -> Path:
    """``$BARTER_MINI_CACHE`` if set, else ``runs/cache`` beside the package."""
    return Path(os.environ.get("BARTER_MINI_CACHE", PACKAGE.parent / "runs" / "cache"))


def source_digest() -> str:
    """SHA-256 over the source files of :data:`TRAINING_LAYERS`, with their paths, leaving out
    :data:`ORCHESTRATION_MODULES`."""
    digest = hashlib.sha256()
    for layer in TRAINING_LAYERS:
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            relative = path.relative_to(PACKAGE).as_posix()
            if relative in ORCHESTRATION_MODULES:
                continue
            digest.update(relative.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _portable_init(init: str | None) -> str | None:
    """A checkpoint inside a cache folder by that folder's name and the file's, not by its
    absolute path: the folder's name is its run's key, so fine-tuning runs keep their keys when
    a cache computed on one machine (a cluster) is read from another path on another."""
    if init is None:
        return None
    path = Path(init)
    return f"cache:{path.parent.name}/{path.name}" if CACHE_FOLDER_NAME.match(path.parent.name) else init


def run_key(run: RunConfig) -> str:
    """Hash of everything that determines the run's results (not where data lives)."""
    config = asdict(run)
    for irrelevant in ("progress", "data_root", "download"):
        config.pop(irrelevant)
    config["init"] = _portable_init(config["init"])
    payload = json.dumps({"run": config, "version": __version__, "source": source_digest()},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def run_dir(run: RunConfig, cache_dir: Path | None = None) -> Path:
    name = f"{run.method}-{run.model}-{run.dataset}-rho{run.density:g}-seed{run.seed}-{run_key(run)}"
    return Path(cache_dir or default_cache_dir()) / name


def partial_dir(target: Path) -> Path:
    """Where the run of cache folder ``target`` trains until it is complete (hidden)."""
    return target.with_name(f".{target.name}.partial")


def lock_path(target: Path) -> Path:
    """The lock file that guards :func:`partial_dir` of ``target`` (hidden)."""
    return target.with_name(f".{target.name}.lock")


@contextlib.contextmanager
def run_lock(target: Path) -> Iterator[None]:
    """Hold the exclusive lock on ``target``'s partial folder, or raise a one-line
    :class:`~barter_mini.errors.BarterError` at once if another process holds it.

    ``fcntl.flock`` on :func:`lock_path`: the kernel releases it when its holder exits, however
    it exits (a SIGKILL included), so a killed run never leaves a stale lock; on NFS, Linux
    maps it to a POSIX lock that the server arbitrates across nodes. The file records the
    holder (host and process) for the message. It is removed only after the run completes:
    a process that still opened the old file then takes a lock on an unlinked file, but it
    finds the run complete and trains nothing.
    """
    path = lock_path(target)
    handle = open(path, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise BarterError(f"run {target.name} is being trained by {holder} (lock {path}): "
                              "wait for it to finish, or stop it, then ask again") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        yield
    finally:
        handle.close()


def run_is_locked(target: Path) -> bool:
    """Whether another process is training ``target``'s run now (the lock is taken)."""
    path = lock_path(target)
    if not path.exists():
        return False
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def training_allowed() -> bool:
    """False when ``$BARTER_MINI_TRAIN`` is ``0`` (read-only cache), True when unset or ``1``."""
    value = os.environ.get(TRAIN_ENV, "1").strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise BarterError(f"{TRAIN_ENV} must be 1 (train missing runs) or 0 (only read the run cache), got {value!r}")


def sweep_command(run: RunConfig) -> str:
    """The ``barter-mini sweep`` command that trains ``run`` into the default cache: its grid
    flags when the run is a plain grid point, else the notebooks' own grids (``--book``)."""
    plain = run.validate() == RunConfig(
        method=run.method, model=run.model, dataset=run.dataset, density=run.density, seed=run.seed,
        recipe=run.recipe, epochs=run.epochs, train_subset=run.train_subset,
        data_root=run.data_root, download=run.download, device=run.device, progress=run.progress).validate()
    if not plain:
        return "barter-mini sweep --book PROFILE"
    flags = ["--methods", run.method, "--densities", f"{run.density:g}", "--seeds", str(run.seed),
             "--model", run.model, "--dataset", run.dataset, "--recipe", run.recipe]
    flags += ["--epochs", str(run.epochs)] if run.epochs is not None else []
    flags += ["--train-subset", str(run.train_subset)] if run.train_subset is not None else []
    return shlex.join(["barter-mini", "sweep", *flags])


def _metrics_in(target: Path) -> dict | None:
    return read_json(target / "metrics.json") if (target / "metrics.json").is_file() else None


def cached_metrics(run: RunConfig, cache_dir: Path | None = None) -> dict | None:
    """The metrics of ``run`` if the cache holds it, else None; never trains."""
    return _metrics_in(run_dir(run.validate(), cache_dir))


def cached_train(run: RunConfig, cache_dir: Path | None = None, train_missing: bool | None = None,
                 checkpoint_every: int | None = None) -> dict:
    """The metrics of ``run``: read from the cache, or trained once (resuming an interrupted
    attempt) and cached.

    ``train_missing`` None follows ``$BARTER_MINI_TRAIN`` (:func:`training_allowed`); False
    turns a missing run into a one-line :class:`~barter_mini.errors.BarterError` naming it and the
    :func:`sweep_command` that trains it. A run another process is training now is a one-line
    error too (:func:`run_lock`). ``checkpoint_every``: also write ``last.pt`` every that many
    optimizer steps (besides every epoch), so an interrupted run loses at most those steps.
    """
    target = run_dir(run.validate(), cache_dir)      # hashes the package source: once
    cached = _metrics_in(target)
    if cached is not None:
        return cached
    if not (training_allowed() if train_missing is None else train_missing):
        command = sweep_command(run)
        book = " (PROFILE: the notebook's profile)" if "--book" in command else ""
        raise BarterError(f"run {target.name} is not in the run cache {target.parent} and {TRAIN_ENV}=0 "
                          f"forbids training here: train it with `{command}`{book} "
                          f"(same cache: BARTER_MINI_CACHE={target.parent}), or unset {TRAIN_ENV}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with run_lock(target):
        if not target.exists():      # else completed by another process since the first look
            partial = partial_dir(target)
            try:
                train(run, partial, resume=True, checkpoint_every=checkpoint_every)
            except BaseException:
                if partial.is_dir() and not (partial / "last.pt").exists():
                    shutil.rmtree(partial)       # nothing to resume from: leave no trace
                raise
            os.replace(partial, target)
            lock_path(target).unlink(missing_ok=True)   # only once complete: see run_lock
    return read_json(target / "metrics.json")   # the same JSON types on a hit and a miss
