"""Grids of cached training runs, shared by the chapters, the sweep and the recorded grids.

A grid is methods x densities x seeds trained with one notebook profile; every run goes
through :func:`~barter_mini.training.cache.cached_train`, so notebooks share runs and a rebuilt book
retrains nothing. Dense has no density: it is trained once per seed at rho = 1. A grid's
table has one row per run, Top-1 and macro-F1 in percent on validation and test; the
chapters summarize it in their own cells (mean ± SE over seeds, gaps paired by seed).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from tqdm import tqdm

from ..errors import BarterError, choose
from .profiles import Profile
from ..training.methods import check_methods, get_method
from ..training.run_config import RunConfig

#: the paper's reference tables, transcribed as CSV (comment line first)
PAPER_DIR = Path(__file__).resolve().parents[2] / "data" / "paper"


def profile_run(setup: Profile, method: str, density: float, seed: int) -> RunConfig:
    """The training run of ``method`` at ``density`` and ``seed`` under a notebook profile."""
    return RunConfig(method=method, model=setup.model, dataset=setup.dataset, density=density,
                     seed=seed, recipe=setup.recipe, epochs=setup.epochs,
                     train_subset=setup.grid_train_subset, precision=setup.precision, progress=False)


def _densities_of(method: str, densities) -> list[float]:
    """The densities a grid trains ``method`` at: its fixed one (dense: 1) or every one asked."""
    fixed = get_method(method).fixed_density
    return [fixed] if fixed is not None else list(densities)


def grid_runs(setup: Profile, methods, densities, seeds) -> list[RunConfig]:
    """The runs of :func:`run_grid`, in its order (what ``barter-mini sweep`` trains for it)."""
    methods = check_methods(methods)
    return [profile_run(setup, m, d, s) for m in methods for d in _densities_of(m, densities) for s in seeds]


def run_grid(setup: Profile, methods, densities, seeds, progress: bool = True) -> pd.DataFrame:
    """Train (or read from the cache) every run of the grid; one row per run.

    Columns: method, density, seed, val/test Top-1 and macro-F1 (%), wall time, exported-size
    parameters of the trained model, the final per-layer heads and FFN channels.
    """
    rows = []
    for run in tqdm(grid_runs(setup, methods, densities, seeds), desc="runs", disable=not progress):
        method, density, seed = run.method, run.density, run.seed
        metrics = setup.cached_train(run)
        rows.append({"method": method, "density": density, "seed": seed, **run_scores(metrics),
                     "wall_time_s": metrics["wall_time_s"], "params": metrics["params"],
                     "heads": tuple(metrics["allocation"]["heads"]),
                     "ffn": tuple(metrics["allocation"]["ffn"])})
    return pd.DataFrame(rows)


def run_scores(metrics: dict) -> dict:
    """A run's validation and test Top-1 and macro-F1 in %, under the names of the book's
    tables (``val_acc``, ``val_f1``, ``acc``, ``f1``), from its metrics.json."""
    return {"val_acc": 100 * metrics["val_acc"], "val_f1": 100 * metrics["val_macro_f1"],
            "acc": 100 * metrics["test_acc"], "f1": 100 * metrics["test_macro_f1"]}


def read_paper_table(name: str) -> pd.DataFrame:
    """One of ``data/paper/*.csv`` (e.g. ``table01_from_scratch_cct_cifar100``)."""
    path = PAPER_DIR / f"{name}.csv"
    if not path.is_file():
        known = sorted(p.stem for p in PAPER_DIR.glob("*.csv"))
        raise BarterError(f"no paper table {name!r}: known tables are {', '.join(known)}")
    return pd.read_csv(path, comment="#")


def paper_from_scratch() -> pd.DataFrame:
    """Tables 1 (dense, SET, SNFS, RigL) and 13 (static, BARTER), CCT on CIFAR-100."""
    return pd.concat([read_paper_table("table01_from_scratch_cct_cifar100"),
                      read_paper_table("table13_static_vs_barter_cct_cifar100")], ignore_index=True)


def mean_std(mean, std) -> str:
    """``72.85 ± 0.16``: a mean and its spread (the table's header says which: the book's is the
    standard error), the spread left out where it is undefined."""
    if pd.isna(mean):
        return ""
    return f"{mean:.2f}" if pd.isna(std) else f"{mean:.2f} ± {std:.2f}"


def final_allocations(runs: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Units of ``kind`` ("heads" or "ffn") per layer at the end of training, one row per run."""
    choose("kind", kind, ("heads", "ffn"))
    frame = pd.DataFrame(runs[kind].tolist(), index=[f"{m} (seed {s})" for m, s in zip(runs["method"], runs["seed"])])
    frame.columns = pd.Index(range(frame.shape[1]), name="layer")
    return frame
