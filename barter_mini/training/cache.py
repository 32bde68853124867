"""Training runs cached by their full configuration.

Notebooks share runs and rebuilding the book does not retrain what it already has. The
key is a hash of the run's configuration, the package version and a digest of the package
source that affects training; any change to either trains afresh. A run is trained into a
temporary folder and renamed into place only when complete, so the cache never holds half
a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from ..version import __version__
from .checkpoints import read_json
from .trainer import RunConfig, train

PACKAGE = Path(__file__).resolve().parents[1]
#: the layers whose source determines what a training run produces (measurement, the book
#: and the command line do not)
TRAINING_LAYERS = ("core", "masked", "training")


def default_cache_dir() -> Path:
    """``$BARTER_MINI_CACHE`` if set, else ``runs/cache`` beside the package."""
    return Path(os.environ.get("BARTER_MINI_CACHE", PACKAGE.parent / "runs" / "cache"))


def source_digest() -> str:
    """SHA-256 over the source files of :data:`TRAINING_LAYERS`, with their paths."""
    digest = hashlib.sha256()
    for layer in TRAINING_LAYERS:
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            digest.update(path.relative_to(PACKAGE).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def run_key(run: RunConfig) -> str:
    """Hash of everything that determines the run's results (not where data lives)."""
    config = asdict(run)
    for irrelevant in ("progress", "data_root", "download"):
        config.pop(irrelevant)
    payload = json.dumps({"run": config, "version": __version__, "source": source_digest()},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def run_dir(run: RunConfig, cache_dir: Path | None = None) -> Path:
    name = f"{run.method}-{run.model}-{run.dataset}-rho{run.density:g}-seed{run.seed}-{run_key(run)}"
    return Path(cache_dir or default_cache_dir()) / name


def _metrics_in(target: Path) -> dict | None:
    return read_json(target / "metrics.json") if (target / "metrics.json").is_file() else None


def cached_metrics(run: RunConfig, cache_dir: Path | None = None) -> dict | None:
    """The metrics of ``run`` if the cache holds it, else None; never trains."""
    return _metrics_in(run_dir(run.validate(), cache_dir))


def cached_train(run: RunConfig, cache_dir: Path | None = None) -> dict:
    """The metrics of ``run``: read from the cache, or trained once and cached."""
    target = run_dir(run.validate(), cache_dir)      # hashes the package source: once
    cached = _metrics_in(target)
    if cached is not None:
        return cached
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        train(run, scratch)
        if target.exists():          # trained meanwhile by another process
            shutil.rmtree(scratch)
        else:
            os.replace(scratch, target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return read_json(target / "metrics.json")   # the same JSON types on a hit and a miss
