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

An entry counts as finished only when its files are whole: the last thing written into the
partial folder, before it is renamed into place, is a completion record
(:data:`COMPLETION_RECORD`) with the size and SHA-256 digest of every file of the run
(:func:`entry_state`). An entry whose record is missing or whose files no longer match it
(a truncated metrics.json, a deleted best.pt) is damaged: it is reported in one line and
trained again, never read.

``BARTER_MINI_TRAIN=0`` (or ``cached_train(..., train_missing=False)``) makes the cache
read-only: a run it does not hold is a one-line error naming the run and the
``barter-mini sweep`` command that trains it, so a book can be rendered from runs computed
elsewhere (a cluster) without training anything by accident.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import stat
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

from ..core.models import model_family
from ..errors import BarterError
from ..version import __version__
from .checkpoints import check_can_create, read_json, remove_temporary_files, write_json
from .locking import exclusive_lock, is_locked
from .optimization import resolve_recipe
from .run_config import RunConfig, recipe_settings
from .trainer import train
from .trusted_folders import check_own_files, check_trusted_folder

PACKAGE = Path(__file__).resolve().parents[1]
#: the layers whose source determines what a training run produces (measurement, the book
#: and the command line do not)
TRAINING_LAYERS = ("core", "masked", "training")
#: modules of those layers that decide where and when runs train, not what they produce:
#: editing them must not invalidate a cache (or a cluster's worth of sweep results)
ORCHESTRATION_MODULES = ("training/cache.py", "training/sweep.py", "training/locking.py",
                         "training/trusted_folders.py")
#: the environment variable that names the run cache's folder (:func:`default_cache_dir`)
CACHE_ENV = "BARTER_MINI_CACHE"
#: the environment variable that, set to 0, makes :func:`cached_train` read-only
TRAIN_ENV = "BARTER_MINI_TRAIN"
#: the file a complete cache entry holds last: each run file's size and SHA-256 digest
COMPLETION_RECORD = "complete.json"
#: the files of a run (``train``'s) that the completion record vouches for
ENTRY_FILES = ("best.pt", "last.pt", "metrics.json")


def default_cache_dir() -> Path:
    """``$BARTER_MINI_CACHE`` if set, else ``runs/cache`` beside the package. Set but blank is
    refused: ``Path("")`` is the current folder, so a cache would silently grow wherever the
    command happens to run."""
    value = os.environ.get(CACHE_ENV)
    if value is None:
        return PACKAGE.parent / "runs" / "cache"
    if not value.strip():
        raise BarterError(f"{CACHE_ENV} is set but empty: unset it (the run cache is then runs/cache beside the "
                          "package) or give it a folder")
    return Path(value)


def check_cache_dir(cache_dir: Path | None = None, writable: bool = True, create: bool = False) -> Path:
    """The path to ``cache_dir`` (default :func:`default_cache_dir`) that the check walked, links
    resolved, if it is a folder, or, where it is to be ``writable``, a folder that can be
    created; else a one-line error naming the path as given and where it came from. Neither it
    nor a folder above it may be writable by another user
    (:func:`~barter_mini.training.trusted_folders.walk_trusted_folder`): what the cache holds
    decides what the book reports and what a fine-tuning run starts from, so the cache is
    used through the walked path, the folder that passed, whatever a link on the way points
    to later. ``create``: make the folder (never writable by others), else create nothing."""
    cache_dir = Path(cache_dir or default_cache_dir())
    origin = _origin(cache_dir)
    try:
        if writable:
            check_can_create(cache_dir)
        elif cache_dir.exists() and not cache_dir.is_dir():
            raise BarterError(f"{cache_dir} is a file; give a folder")
    except BarterError as error:
        raise BarterError(f"the run cache{origin}: {error}") from None
    return check_trusted_folder(cache_dir, f"the run cache {cache_dir}{origin}", create=create)


def _origin(cache_dir: Path) -> str:
    """`` ($BARTER_MINI_CACHE)`` where ``cache_dir`` came from there, for refusals that name it."""
    env = os.environ.get(CACHE_ENV, "")
    return f" (${CACHE_ENV})" if env.strip() and Path(env) == cache_dir else ""


def _file_record(path: Path) -> dict:
    with open(path, "rb") as f:
        return {"bytes": path.stat().st_size, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}


def write_completion_record(folder: Path, entry: str) -> Path:
    """Record the size and digest of every run file in ``folder`` (:data:`COMPLETION_RECORD`)
    and the name of the cache ``entry`` they are for; written last, atomically, so its presence
    means every other file was whole."""
    files = {name: _file_record(folder / name) for name in ENTRY_FILES if (folder / name).is_file()}
    return write_json(folder / COMPLETION_RECORD, {"files": files, "entry": entry})


def entry_state(target: Path, run: RunConfig | None = None) -> tuple[str, str | None]:
    """``("complete", None)``, ``("missing", None)``, or ``("damaged", why)`` for the cache
    folder ``target``: complete when it is a folder (not a link) that this user or root
    wrote, its completion record is readable, names ``target`` and every file it lists is a
    regular file with the recorded size and digest, metrics.json among them, and (given
    ``run``) metrics.json records that run's settings. The cache serves nothing else."""
    try:
        found = os.lstat(target)
    except FileNotFoundError:
        return "missing", None
    if stat.S_ISLNK(found.st_mode):
        return "damaged", "it is a symbolic link, not a folder the cache made"
    if not stat.S_ISDIR(found.st_mode) or found.st_uid not in (os.geteuid(), 0):
        return "damaged", "not a folder of yours" if stat.S_ISDIR(found.st_mode) else "not a folder"
    record_path = target / COMPLETION_RECORD
    if not _own_regular_file(record_path):
        return "damaged", f"no {COMPLETION_RECORD}: written by an earlier version, or cut short"
    try:
        record = read_json(record_path)
        recorded = {name: (int(entry["bytes"]), str(entry["sha256"])) for name, entry in record["files"].items()}
        entry = record.get("entry", target.name)
    except (BarterError, KeyError, TypeError, ValueError, AttributeError):
        return "damaged", f"{COMPLETION_RECORD} is not readable"
    if entry != target.name:
        return "damaged", f"{COMPLETION_RECORD} is the record of another run ({str(entry)[:80]!r})"
    if "metrics.json" not in recorded:
        return "damaged", f"{COMPLETION_RECORD} lists no metrics.json"
    for name, (size, digest) in sorted(recorded.items()):
        path = target / name
        if not _own_regular_file(path):
            return "damaged", f"{name} is missing"
        if path.stat().st_size != size:
            return "damaged", f"{name} has {path.stat().st_size} bytes, {size} when it was written"
        if _file_record(path)["sha256"] != digest:
            return "damaged", f"{name} is not what was written (its SHA-256 differs)"
    if run is not None:
        differing = _recorded_run_differs(target / "metrics.json", run)
        if differing:
            return "damaged", f"metrics.json records another run ({differing})"
    return "complete", None


def _own_regular_file(path: Path) -> bool:
    """Whether ``path`` is a regular file (not a link) of this user or root."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(found.st_mode) and found.st_uid in (os.geteuid(), 0)


def _recorded_run_differs(metrics_path: Path, run: RunConfig) -> str | None:
    """The settings in which the run recorded in ``metrics_path`` differs from ``run`` as its
    key sees them (:func:`key_settings`: ``--epochs 3`` on a 3-epoch recipe is the same run),
    as "method 'static' there, 'barter' here", or None when it is that run. The ``init``
    file is not compared by path: the key fixes it by its digest, and a cache copied from a
    cluster names the same file under another path."""
    try:
        saved_run = read_json(metrics_path)["run"]
        fields = {name for name in asdict(RunConfig())}
        saved = key_settings(RunConfig(**{key: value for key, value in saved_run.items() if key in fields}))
    except (BarterError, KeyError, TypeError, ValueError, AttributeError):
        return "no readable run settings"
    now = key_settings(run.validate())
    plain = lambda value: json.loads(json.dumps(value, sort_keys=True, default=str))    # tuples as lists
    differing = sorted(key for key in set(saved) | set(now) if key != "init" and plain(saved.get(key)) != plain(now.get(key)))
    return ", ".join(f"{key} {saved.get(key)!r} there, {now.get(key)!r} here" for key in differing[:3]) or None


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


#: the SHA-256 digests of ``--init`` files hashed in this process, by path, device, inode, size
#: and modification time: a sweep keys many runs on one checkpoint, often hundreds of MB
_INIT_DIGESTS: dict[tuple, str] = {}


def _file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        stat = os.fstat(f.fileno())
        stamp = (str(path.resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if stamp not in _INIT_DIGESTS:
            _INIT_DIGESTS[stamp] = hashlib.file_digest(f, "sha256").hexdigest()
    return _INIT_DIGESTS[stamp]


def _portable_init(init: str | None) -> str | None:
    """What a run's key records of its ``init`` checkpoint: what the file holds, not where it
    lies, so a checkpoint changed under the same name trains afresh and the keys stay the
    same on every machine.

    A file is known by its SHA-256 digest wherever it lies, a pretrained run's checkpoint in
    the cache included (a sweep lists a fine-tuning stage only once its pretraining is
    complete): a name says nothing about what a file now holds. A file that cannot be read
    keeps its path: such a run is refused before it trains (``RunConfig.validate``), so that
    key names no cached run."""
    if init is None:
        return None
    path = Path(init)
    try:
        return f"sha256:{_file_digest(path)}"
    except OSError:
        return init


def key_settings(run: RunConfig) -> dict:
    """The settings of ``run`` that its key hashes, the ``init`` file still as its path: the
    recipe resolved, where data lives and the progress bar left out."""
    config = asdict(run)
    for irrelevant in ("progress", "data_root", "download", "method_settings", *recipe_settings()):
        config.pop(irrelevant)
    config["resolved_recipe"] = asdict(resolve_recipe(run, model_family(run.model)))
    return config


def run_key(run: RunConfig) -> str:
    """Hash of everything that determines the run's results (not where data lives). The recipe
    enters resolved (:func:`~barter_mini.training.optimization.resolve_recipe`), not as the
    settings that produced it: a run that restates a recipe value (``clone_moments="fresh"``,
    ``--epochs 3`` on the quick recipe) is the same run, trained once, whichever notebook asks."""
    config = key_settings(run)
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


def refuse_links(*paths: Path) -> None:
    """A one-line error if one of ``paths`` (an entry, its partial folder) is a symbolic link:
    the names are the cache's own, in a folder others may write, and a run trained through a
    planted link would write (and, on failure, delete) inside whatever folder it names."""
    for path in paths:
        if path.is_symlink():
            raise BarterError(f"{path} in the run cache is a symbolic link, not a folder the cache made: refused, "
                              "since training through it would write where it points; delete the link and ask again")


def refuse_foreign_partial(partial: Path) -> None:
    """A one-line error if the partial folder ``partial`` or a file in it was made by another
    user: an interrupted run is resumed only from what this user's own runs wrote (a planted
    ``last.pt`` would otherwise be trained on, finalized and vouched for by the completion
    record)."""
    try:
        found = os.lstat(partial)
    except FileNotFoundError:
        return
    if found.st_uid != os.geteuid():
        raise BarterError(f"{partial} in the run cache was made by another user (user id {found.st_uid}): "
                          "refused, since the cache resumes only its own runs; delete it and ask again")
    check_own_files(partial, sorted(os.listdir(partial)), "the run cache's partial folder")


def lock_path(target: Path) -> Path:
    """The lock file that guards :func:`partial_dir` of ``target`` (hidden)."""
    return target.with_name(f".{target.name}.lock")


@contextlib.contextmanager
def run_lock(target: Path) -> Iterator[None]:
    """Hold the exclusive lock on ``target``'s partial folder (:func:`lock_path`,
    :func:`~barter_mini.training.locking.exclusive_lock`), or raise a one-line error at once if
    another process holds it. The lock file is removed only after the run completes: a
    process that still opened the old file then takes a lock on an unlinked file, but it
    finds the run complete and trains nothing."""
    with exclusive_lock(lock_path(target), f"run {target.name}"):
        yield


def run_is_locked(target: Path) -> bool:
    """Whether another process is training ``target``'s run now (the lock is taken)."""
    return is_locked(lock_path(target))


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


def _metrics_in(target: Path, run: RunConfig) -> dict | None:
    """The metrics of the cache entry ``target`` if it is complete and records ``run``, else None."""
    return read_json(target / "metrics.json") if entry_state(target, run)[0] == "complete" else None


def cached_metrics(run: RunConfig, cache_dir: Path | None = None) -> dict | None:
    """The metrics of ``run`` if the cache holds it whole, else None; never trains."""
    return _metrics_in(run_dir(run.validate(), check_cache_dir(cache_dir, writable=False)), run)


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
    target = run_dir(run.validate(), check_cache_dir(cache_dir, writable=False))   # hashes the source: once
    state, damage = entry_state(target, run)
    if state == "complete":
        return read_json(target / "metrics.json")
    if not (training_allowed() if train_missing is None else train_missing):
        command = sweep_command(run)
        book = " (PROFILE: the notebook's profile)" if "--book" in command else ""
        where = (f"is damaged in the run cache {target.parent} ({damage})" if state == "damaged"
                 else f"is not in the run cache {target.parent}")
        raise BarterError(f"run {target.name} {where} and {TRAIN_ENV}=0 "
                          f"forbids training here: train it with `{command}`{book} "
                          f"(same cache: {CACHE_ENV}={target.parent}), or unset {TRAIN_ENV}")
    target = check_cache_dir(target.parent, create=True) / target.name
    with run_lock(target):
        refuse_links(target, partial_dir(target))
        state, damage = entry_state(target, run)     # another process may have completed it meanwhile
        if state != "complete":
            if state == "damaged":
                print(f"run {target.name} in the run cache is damaged ({damage}): training it again",
                      file=sys.stderr)
                shutil.rmtree(target)
            partial = partial_dir(target)
            refuse_foreign_partial(partial)
            try:
                train(run, partial, resume=True, checkpoint_every=checkpoint_every)
            except BaseException:
                if partial.is_dir() and not (partial / "last.pt").exists():
                    shutil.rmtree(partial)       # nothing to resume from: leave no trace
                raise
            remove_temporary_files(partial, (COMPLETION_RECORD,))   # a record's write killed before
            write_completion_record(partial, target.name)
            os.replace(partial, target)
            lock_path(target).unlink(missing_ok=True)   # only once complete: see run_lock
    return read_json(target / "metrics.json")   # the same JSON types on a hit and a miss
