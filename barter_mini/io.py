"""Atomic writes and checkpoints: a crash never leaves a half-written result behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from .errors import BarterError


def _atomic(path: Path, write: Callable[[str], None]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
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


def save_checkpoint(path: Path, checkpoint: dict) -> Path:
    return _atomic(path, lambda tmp: torch.save(checkpoint, tmp))


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise BarterError(f"no checkpoint at {path}: pass a best.pt or last.pt written by barter-mini train")
    return torch.load(path, map_location=map_location, weights_only=False)


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)
