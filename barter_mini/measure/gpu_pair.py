"""``barter-mini sweep --profile gpu-pair``: BARTER against Static near the paper's scale, on
one GPU, in a stated time.

The book's reallocation measurements run on two CPU cores: a 4-layer model, 3 epochs, a
subset of CIFAR-10. The paper's gains were measured on its 7-layer CCT over 200 epochs
(Table 13). This profile trains the pair the book cannot: the paper's CCT (``cct-paper``) on
CIFAR-10 at rho 0.1, BARTER and Static on :data:`SEEDS` (paired by seed), bf16 with CUDA
graphs at the paper's batch of 128, for as many epochs as fit :data:`DEFAULT_BUDGET_S`
(:func:`plan_pair`), the cosine schedule sized to those epochs (the recipe's schedule runs
over the run's own epochs).

The epochs come from step times measured on the GPU before any run starts
(:func:`measure_step_seconds`): each run's epochs cost ``steps_per_epoch x step_s``, plus
its evaluations and its fixed start. Runs that train side by side (``--jobs N``, one
process each, the GPU's memory shared) are assumed to gain nothing from sharing it, so the
plan holds for any ``N`` and a larger ``N`` can only finish sooner.

Each finished run's row is written at once (:func:`run_pair`): one CSV row in the columns of
chapter 05's map (:data:`COLUMNS`) with the device, its name, torch's version, the precision,
the batch and the commit, so a time limit keeps every run that finished. Chapter 05 draws
recorded GPU rows beside its CPU cells.

It runs where nothing can be installed, from the source tree::

    PYTHONPATH=. python3 -m barter_mini.cli sweep --profile gpu-pair --jobs 5 --out pair.csv
"""

from __future__ import annotations

import inspect
import json
import math
import os
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.models import get_model_config
from ..errors import BarterError, check_integer
from ..training.checkpoints import write_csv_atomically
from ..training.data.datasets import load_dataset
from ..training.recipes import get_recipe
from ..training.run_config import RunConfig
from .bench import EPOCH_IMAGES, run_step
from .processes import child_environment, last_error_line
from .timing import interleaved_times

#: the pair's seeds (BARTER and Static on each)
SEEDS = (0, 1, 2, 3, 4)
#: what the pair may take on the GPU, by default (seconds): nine of a ten-minute lend
DEFAULT_BUDGET_S = 9 * 60
#: seconds a run spends besides its epochs, assumed until measured: the process's start,
#: the data, the model, the first graph recording, the final test
RUN_FIXED_S = 25.0
#: an epoch's evaluation (validation split) as a share of its training steps' time, assumed
EVAL_SHARE = 0.1
#: the columns of a row: chapter 05's map's, then the GPU's
COLUMNS = ("model", "dataset", "density", "epochs", "train_subset", "start", "method", "seed", "val_acc",
           "test_acc", "train_time_s", "threads", "commit", "command",
           "device", "device_name", "torch", "precision", "cuda_graphs", "batch", "recipe")


@dataclass(frozen=True)
class PairSetting:
    """What the pair trains: the paper's CCT on CIFAR-10 at rho 0.1, bf16 + CUDA graphs,
    batch 128 (Table 5's CCT recipe, its epochs set by the budget)."""

    model: str = "cct-paper"
    dataset: str = "cifar10"
    density: float = 0.1
    methods: tuple[str, ...] = ("static", "barter")
    seeds: tuple[int, ...] = SEEDS
    recipe: str = "paper"
    precision: str = "bf16"
    cuda_graphs: bool = True
    device: str = "cuda"
    train_subset: int | None = None
    data_root: str | None = None

    def run(self, method: str, seed: int, epochs: int) -> RunConfig:
        return RunConfig(method=method, model=self.model, dataset=self.dataset, density=self.density, seed=seed,
                         recipe=self.recipe, epochs=epochs, precision=self.precision, cuda_graphs=self.cuda_graphs,
                         device=self.device, train_subset=self.train_subset, data_root=self.data_root,
                         progress=False).validate()


@dataclass(frozen=True)
class PairPlan:
    """The runs, their epochs and what they are expected to take."""

    setting: PairSetting
    epochs: int
    runs: tuple[RunConfig, ...]
    budget_s: float
    step_s: dict
    steps_per_epoch: int
    jobs: int
    estimated_s: float

    def describe(self) -> str:
        steps = ", ".join(f"{method} {1000 * s:.1f} ms" for method, s in self.step_s.items())
        return (f"gpu-pair: {len(self.runs)} runs ({', '.join(self.setting.methods)} x seeds "
                f"{', '.join(map(str, self.setting.seeds))}), {self.setting.model} on {self.setting.dataset} at "
                f"rho {self.setting.density:g}, {self.epochs} epochs of {self.steps_per_epoch} steps each "
                f"(measured steps: {steps}), {self.jobs} at a time; estimated {self.estimated_s / 60:.1f} min of "
                f"a {self.budget_s / 60:.1f} min budget")


def steps_per_epoch(setting: PairSetting) -> int:
    """Optimizer steps in one epoch: the official training split less the validation held out
    (at most ``train_subset``), in whole batches of the recipe's size."""
    official = EPOCH_IMAGES[setting.dataset]
    held_out = round(inspect.signature(load_dataset).parameters["val_fraction"].default * official)
    train_images = min(official - held_out, setting.train_subset or official)
    batch = batch_size(setting.model, setting.recipe)
    return train_images // batch if train_images >= batch else 1      # the loader drops a last, smaller batch


def batch_size(model: str, recipe: str) -> int:
    """The batch of ``recipe`` for ``model``'s family (the paper's CCT: 128)."""
    return get_recipe(recipe, get_model_config(model).family).batch_size


def plan_pair(setting: PairSetting, step_s: dict, budget_s: float = DEFAULT_BUDGET_S, jobs: int = 1) -> PairPlan:
    """The most epochs whose runs fit ``budget_s``, from each method's measured seconds per
    step ``step_s``. The GPU is taken as shared with no gain (a round of ``jobs`` runs side
    by side takes their summed time), so the estimate is

    ``sum over runs of (RUN_FIXED_S / jobs + epochs x steps_per_epoch x step_s x (1 + EVAL_SHARE))``

    and epochs is the largest whole number that keeps it within the budget; a one-line
    error if not even one epoch fits."""
    check_integer("jobs", jobs)
    if not budget_s > 0:
        raise BarterError(f"the pair's budget must be a positive number of minutes, got {budget_s / 60:g}")
    missing = [method for method in setting.methods if method not in step_s]
    if missing:
        raise BarterError(f"no measured step time for {', '.join(missing)}")
    per_epoch = steps_per_epoch(setting)
    runs_of = {method: len(setting.seeds) for method in setting.methods}
    fixed = sum(runs_of.values()) * RUN_FIXED_S / jobs
    epoch_s = sum(n * per_epoch * step_s[method] * (1 + EVAL_SHARE) for method, n in runs_of.items())
    epochs = math.floor((budget_s - fixed) / epoch_s) if budget_s > fixed else 0
    if epochs < 1:
        raise BarterError(f"the pair's budget of {budget_s / 60:.1f} min fits no epoch: one epoch of every run takes "
                          f"about {(fixed + epoch_s) / 60:.1f} min; give a larger --budget-min or fewer seeds")
    runs = tuple(setting.run(method, seed, epochs) for seed in setting.seeds for method in setting.methods)
    return PairPlan(setting, epochs, runs, budget_s, dict(step_s), per_epoch, jobs, fixed + epochs * epoch_s)


def measure_step_seconds(setting: PairSetting, steps: int = 20, warmup: int = 5) -> dict:
    """Each method's median seconds per training step, its parts built as ``train`` builds
    them, on a synthetic batch at the recipe's batch size, the methods interleaved
    (:func:`~barter_mini.measure.timing.interleaved_times`)."""
    device = torch.device(setting.device)
    total = 100 * steps_per_epoch(setting)
    setups = {method: run_step(setting.run(method, setting.seeds[0], 100), batch_size(setting.model, setting.recipe),
                                total, device) for method in setting.methods}
    times = interleaved_times(setups, steps, warmup, device)
    del setups
    if device.type == "cuda":
        torch.cuda.empty_cache()      # the runs train in other processes: this one holds no memory for them
    return {method: sorted(values)[len(values) // 2] for method, values in times.items()}


def commit_of_source() -> str:
    """The commit the code was checked out at: ``$BARTER_MINI_COMMIT`` (a copy of the tree
    without its ``.git``), else git's ``HEAD``, else empty."""
    if os.environ.get("BARTER_MINI_COMMIT"):
        return os.environ["BARTER_MINI_COMMIT"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    return head.stdout.strip() if head.returncode == 0 else ""


def train_command(run: RunConfig, out: Path) -> list[str]:
    """``barter-mini train`` of ``run`` into ``out``, as a process of this Python."""
    flags = ["--method", run.method, "--model", run.model, "--dataset", run.dataset, "--density", f"{run.density:g}",
             "--seed", str(run.seed), "--recipe", run.recipe, "--epochs", str(run.epochs),
             "--precision", run.precision, "--device", run.device, "--no-progress", "--out", str(out)]
    flags += ["--cuda-graphs"] if run.cuda_graphs else []
    flags += ["--train-subset", str(run.train_subset)] if run.train_subset is not None else []
    flags += ["--data-root", run.data_root] if run.data_root is not None else []
    return [sys.executable, "-m", "barter_mini.cli", "train", *flags]


def pair_row(run: RunConfig, metrics: dict, commit: str) -> dict:
    """One finished run as a row of :data:`COLUMNS`."""
    name = torch.cuda.get_device_name() if run.device == "cuda" and torch.cuda.is_available() else run.device
    return {"model": run.model, "dataset": run.dataset, "density": run.density, "epochs": metrics["epochs"],
            "train_subset": run.train_subset or "", "start": run.start, "method": run.method, "seed": run.seed,
            "val_acc": metrics["val_acc"], "test_acc": metrics["test_acc"],
            "train_time_s": round(metrics["train_time_s"], 1), "threads": metrics["threads"], "commit": commit,
            "command": shlex.join(["barter-mini", *train_command(run, Path("RUN"))[3:]]),
            "device": metrics["device"], "device_name": name, "torch": torch.__version__,
            "precision": run.precision, "cuda_graphs": run.cuda_graphs,
            "batch": batch_size(run.model, run.recipe), "recipe": run.recipe}


def run_pair(plan: PairPlan, out: Path, folder: Path, commit: str | None = None, log=print) -> list[dict]:
    """Every run of ``plan``, ``plan.jobs`` at a time, each ``barter-mini train`` in a
    process of its own (a run's folder under ``folder``); each finished run's row is
    added to the CSV ``out`` at once (rewritten atomically), so a time limit loses only the
    runs still training. A failed run is logged with its last error line and left out."""
    commit = commit_of_source() if commit is None else commit
    rows, lock, started = [], threading.Lock(), time.perf_counter()

    def train_one(run: RunConfig) -> None:
        target = Path(folder) / f"{run.method}-seed{run.seed}"
        result = subprocess.run(train_command(run, target), capture_output=True, text=True, env=child_environment())
        elapsed = (time.perf_counter() - started) / 60
        if result.returncode != 0:
            why = last_error_line(result.stderr.splitlines()) or "no error output"
            log(f"{run.method} seed {run.seed}: failed after {elapsed:.1f} min: {why}")
            return
        metrics = json.loads((target / "metrics.json").read_text())
        with lock:                # the line reports this write, before another run's can follow it
            rows.append(pair_row(run, metrics, commit))
            write_csv_atomically(Path(out), COLUMNS, rows)
            log(f"{run.method} seed {run.seed}: val {metrics['val_acc']:.4f}, test {metrics['test_acc']:.4f} "
                f"({elapsed:.1f} min) -> {out} ({len(rows)} rows)")

    with ThreadPoolExecutor(max_workers=plan.jobs) as pool:
        list(pool.map(train_one, plan.runs))
    return rows
