"""Atomic writes and checkpoints: a crash never leaves a half-written result behind.

A checkpoint is a dict saved with ``torch.save``: ``format`` (:data:`CHECKPOINT_FORMAT`), the
run and recipe settings, the model configuration and per-layer ``allocation`` (so the
compact model can be rebuilt with the right tensor sizes), the model and optimizer state,
the method controller's state (``controller``), and the epoch, step and validation scores.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch

from ..core.budgets import Allocation
from ..core.configs import ModelConfig
from ..core.models import CompactTransformer, build_model
from ..errors import BarterError

#: the layout of every checkpoint this version writes and reads (``best.pt``, ``last.pt``)
CHECKPOINT_FORMAT = 2


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


def _atomic(path: Path, write: Callable[[str], None]) -> Path:
    path = Path(path)
    ensure_folder(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, data: Any) -> Path:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
    return _atomic(path, write)


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def save_checkpoint(path: Path, checkpoint: dict) -> Path:
    return _atomic(path, lambda tmp: torch.save(checkpoint, tmp))


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict:
    """A checkpoint written by this version; a one-line error for a missing, truncated or
    foreign file."""
    path = Path(path)
    if not path.is_file():
        raise BarterError(f"no checkpoint at {path}: pass a best.pt or last.pt written by barter-mini train")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=False)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as error:
        raise BarterError(f"{path} is not a readable checkpoint ({type(error).__name__}): "
                          "it may be truncated; retrain or pass another file") from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        found = checkpoint.get("format") if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise BarterError(f"{path} is not a barter-mini checkpoint of format {CHECKPOINT_FORMAT} "
                          f"(found {found!r}): retrain the run with this version")
    return checkpoint


def model_from_checkpoint(checkpoint: dict, device: torch.device | str = "cpu") -> CompactTransformer:
    """Rebuild the compact model a checkpoint was saved from (its per-layer allocation)."""
    config = ModelConfig.from_dict(checkpoint["model_config"])
    allocation = Allocation(**{k: tuple(v) for k, v in checkpoint["allocation"].items()})
    model = build_model(config, allocation=allocation)
    model.load_state_dict(checkpoint["model"])
    return model.to(device)
