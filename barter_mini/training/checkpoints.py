"""Atomic writes and checkpoints: a crash never leaves a half-written result behind, and a
file read back never runs code.

A checkpoint is a dict saved with ``torch.save``: ``format`` (:data:`CHECKPOINT_FORMAT`), the
run and recipe settings, the model configuration and per-layer ``allocation`` (so the
compact model can be rebuilt with the right tensor sizes), the model and optimizer state,
the method controller's state (``controller``), and the epoch, step and validation scores.

It holds only tensors, numbers, strings, None and plain containers (dicts, lists, tuples):
settings as dicts, random generators' states as tensors, lists and ints. Every file is read
with ``torch.load(..., weights_only=True)``, PyTorch's restricted unpickler, which builds
nothing else; a pickle that names any other class or function (``os.system`` in a
downloaded file's ``__reduce__``) is refused before anything is called, in one line that
names the file. A file that loads but lacks what its use needs (:data:`MODEL_KEYS`,
:data:`RUN_KEYS`, :data:`RESUME_KEYS`) is one line too.

Results are written through a temporary file beside the target, renamed into place
(:func:`write_json`, :func:`save_checkpoint`), with the permissions the user's umask gives a
new file: a shared cache stays readable by the group where the umask says so.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import struct
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch

from ..core.budgets import Allocation
from ..core.configs import ModelConfig
from ..core.models import CompactTransformer, build_model
from ..errors import BarterError

#: the layout of every checkpoint this version writes and reads (``best.pt``, ``last.pt``);
#: 3: only plain types (NumPy's generator states as lists), read with ``weights_only=True``
CHECKPOINT_FORMAT = 3
#: what a checkpoint needs to rebuild its model (:func:`model_from_checkpoint`; ``--init``, exports)
MODEL_KEYS = ("model_config", "allocation", "model")
#: ... and to be a training run's (``best.pt``, ``last.pt``: its settings, controller, scores)
RUN_KEYS = MODEL_KEYS + ("run", "controller", "epoch", "val")
#: ... and to continue it exactly (``last.pt`` with ``--resume``)
RESUME_KEYS = RUN_KEYS + ("recipe", "optimizer", "step", "resume")
#: a temporary file of an atomic write of the result ``name``: ``.NAME.`` and mkstemp's suffix
TEMPORARY_PREFIX = ".{name}."


def ensure_folder(folder: Path) -> Path:
    """Create ``folder`` (and its parents); a one-line error where that is impossible."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise BarterError(f"cannot create the folder {folder}: a part of the path is a file; "
                          "choose a path whose parents are folders") from None
    except PermissionError:
        raise BarterError(f"cannot create the folder {folder}: permission denied") from None
    return folder


def check_can_create(folder: Path) -> Path:
    """Refuse, before any work is done, a folder that cannot be created: the nearest existing
    part of the path must be a folder we may write in. Creates nothing."""
    folder = Path(folder)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise BarterError(f"cannot create the folder {folder}: {existing} is a file; "
                          "choose a path whose parents are folders")
    # a trial folder, removed at once: os.access says yes to root and on read-only or
    # virtual file systems (/proc, /sys), where only an actual mkdir tells
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".barter-mini-probe.", dir=existing))
    except OSError as error:
        raise BarterError(f"cannot create the folder {folder}: {existing} is not writable "
                          f"({error.strerror or type(error).__name__})") from None
    return folder


def _umask() -> int:
    mask = os.umask(0o022)      # reading the umask means setting it: set it straight back
    os.umask(mask)
    return mask


def write_atomically(path: Path, write: Callable[[str], None]) -> Path:
    """Write ``path`` through ``write(temporary_path)``, then rename it into place: a reader
    sees the old file or the whole new one, never half of it; the file gets the umask's mode."""
    path = Path(path)
    ensure_folder(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=TEMPORARY_PREFIX.format(name=path.name), dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        # mkstemp makes 0600 files; a result gets what open() would give it (0666 less the umask)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def remove_temporary_files(folder: Path, names) -> list[Path]:
    """Delete what a write of one of ``names`` (``last.pt``, ``metrics.json``) killed midway
    left in ``folder`` (``.last.pt.XXXXXXXX``, up to a checkpoint's size); return them.
    Call it only while no other process writes there (under the run folder's lock)."""
    removed = []
    for name in names:
        for leftover in Path(folder).glob(TEMPORARY_PREFIX.format(name=name) + "*"):
            if leftover.is_file():
                leftover.unlink(missing_ok=True)
                removed.append(leftover)
    return removed


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or infinite float inside it (dicts, lists, tuples) replaced by
    None: JSON has no such numbers, and ``null`` reads as "no finite value"."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item) for item in value]
    return value


def write_json(path: Path, data: Any) -> Path:
    """``data`` as strict JSON (RFC 8259: no bare NaN or Infinity, :func:`finite_or_none`),
    atomically."""
    data = finite_or_none(data)

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True, allow_nan=False)
            f.write("\n")
    return write_atomically(path, write)


def read_json(path: Path) -> Any:
    """The JSON document at ``path``; a one-line error naming the file if it is not one."""
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BarterError(f"{path} is not a readable JSON file ({type(error).__name__}: {error}): "
                          "it may be truncated; delete it and train the run again") from None


def save_checkpoint(path: Path, checkpoint: dict) -> Path:
    return write_atomically(path, lambda tmp: torch.save(checkpoint, tmp))


#: what the restricted unpickler says when a file names a class or function it does not build
#: (as against a damaged stream: "Unsupported operand", a short read)
UNSAFE_PICKLE = re.compile(r"GLOBAL|Unsupported class|call reduce|Can only (build|create)")


class UnsafeFileError(BarterError):
    """A file that names a class or function the restricted unpickler does not build: loading
    it the ordinary way could run code (:func:`load_plain`)."""


def load_plain(path: Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> Any:
    """What ``torch.load`` reads from ``path`` with the restricted unpickler
    (``weights_only=True``): tensors, numbers, strings and plain containers only. A file that
    names anything else (code that would run), or that is truncated or no checkpoint at all,
    is a one-line :class:`~barter_mini.errors.BarterError` naming it (:class:`UnsafeFileError` for the
    first). ``mmap``: map the tensors' storage instead of reading it (a probe of a large file)."""
    path = Path(path)
    if not path.is_file():
        raise BarterError(f"no checkpoint at {path}: pass a best.pt or last.pt written by barter-mini train")
    try:
        with warnings.catch_warnings():     # a bare pickle's protocol warning: the refusal says enough
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        if not UNSAFE_PICKLE.search(str(error)):       # a damaged pickle stream, not a refusal
            reason = re.search(r"(Unsupported operand \S+)", str(error))
            raise BarterError(f"{path} is not a readable checkpoint (UnpicklingError"
                              f"{': ' + reason.group(1) if reason else ''}): it may be truncated or not written "
                              "by torch.save, and nothing in it was run; retrain or pass another file") from None
        named = re.search(r"GLOBAL (\S+)", str(error))
        raise UnsafeFileError(f"{path} holds more than tensors, numbers, strings and plain containers"
                          f"{f' (it names {named.group(1)})' if named else ''}: it was not loaded, because "
                          "unpickling such a file can run any code; use a file barter-mini or timm wrote, "
                          "from a source you trust (a barter-mini checkpoint of format 2 or older: retrain it)") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError, struct.error) as error:
        raise BarterError(f"{path} is not a readable checkpoint ({type(error).__name__}): "
                          "it may be truncated; retrain or pass another file") from None


def check_keys(checkpoint: dict, path: Path, keys: tuple[str, ...], use: str) -> dict:
    """``checkpoint`` if it holds every one of ``keys``, else a one-line error naming the file
    and what it lacks for ``use`` (what it was read for)."""
    missing = [key for key in keys if key not in checkpoint]
    if missing:
        raise BarterError(f"{path} lacks {', '.join(missing)}, which {use} needs: "
                          "pass a best.pt or last.pt written by barter-mini train with this version")
    return checkpoint


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu", keys: tuple[str, ...] = MODEL_KEYS,
                    use: str = "rebuilding its model") -> dict:
    """A checkpoint written by this version that holds ``keys`` (by default :data:`MODEL_KEYS`,
    what :func:`model_from_checkpoint` needs: a run's ``best.pt`` or ``last.pt``, or an exported
    model); a one-line error for a missing, truncated, foreign or unsafe file
    (:func:`load_plain`) or one that lacks a key ``use`` needs."""
    return check_checkpoint(load_plain(Path(path), map_location), Path(path), keys, use)


def check_checkpoint(checkpoint: Any, path: Path, keys: tuple[str, ...] = MODEL_KEYS,
                     use: str = "rebuilding its model") -> dict:
    """``checkpoint`` (what :func:`load_plain` read from ``path``) if it is a checkpoint of
    :data:`CHECKPOINT_FORMAT` that holds ``keys``, else a one-line error."""
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        found = checkpoint.get("format") if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise BarterError(f"{path} is not a barter-mini checkpoint of format {CHECKPOINT_FORMAT} "
                          f"(found {found!r}): retrain the run with this version")
    return check_keys(checkpoint, path, keys, use)


def model_from_checkpoint(checkpoint: dict, device: torch.device | str = "cpu",
                          path: Path | str = "the checkpoint") -> CompactTransformer:
    """Rebuild the compact model a checkpoint was saved from (its per-layer allocation); a
    one-line error naming ``path`` if its configuration, allocation and weights do not fit."""
    try:
        config = ModelConfig.from_dict(checkpoint["model_config"])
        allocation = Allocation(**{k: tuple(v) for k, v in checkpoint["allocation"].items()})
        model = build_model(config, allocation=allocation)
        model.load_state_dict(checkpoint["model"])
    except BarterError as error:
        raise BarterError(f"{path}: {error}") from None
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise BarterError(f"{path} does not describe a model this version can build ({type(error).__name__}"
                          f"{': ' + first[:160] if first else ''}): retrain the run with this version") from None
    return model.to(device)
