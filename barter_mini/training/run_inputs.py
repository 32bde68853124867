"""What a run is built from before its parts: its data, the allocation it starts from, its
model and its length.

:func:`load_splits` cuts the run's dataset to the recipe's subsets; :func:`start_allocation`
is where a compact run starts (its ``start`` rule or a given allocation that holds exactly the
density's budgets); :func:`build_run_model` builds the model (compact, full-width, or cut from
a trained dense model); :func:`run_length` gives the run's optimizer steps: the recipe's
epochs, or as many steps as a compute budget buys (:func:`steps_for_compute`, with
:func:`read_train_pflops` reading a finished run's budget for ``--match-compute``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Subset

from ..core.budgets import Allocation, check_allocation, compute_budget, starting_allocation
from ..core.configs import ModelConfig
from ..core.models import build_model
from ..errors import BarterError
from .checkpoints import read_json
from .data import DataSplits, load_dataset
from .finetune import dense_start
from .methods import get_method
from .recipes import Recipe
from .run_config import RunConfig

#: what building a run reports (the command line shows INFO; a notebook nothing)
LOG = logging.getLogger(__name__)


def steps_for_compute(pflops: float, gflops_per_image: float, batch_size: int) -> int:
    """Optimizer steps whose training compute first reaches ``pflops``:
    ``ceil(pflops * 1e6 / (gflops_per_image * batch_size))``. A compact model's cost per
    image does not change when BARTER moves units (a head, or an FFN channel, costs the same
    in every layer), so the budget is met within one batch."""
    return max(1, math.ceil(pflops * 1e6 / (gflops_per_image * batch_size)))


def read_train_pflops(run_dir: str | Path) -> float:
    """The cumulative training PFLOPs a finished run recorded (``--match-compute``)."""
    path = Path(run_dir) / "metrics.json"
    if not path.is_file():
        raise BarterError(f"{run_dir} holds no metrics.json: match the compute of a finished run folder")
    metrics = read_json(path)
    if "train_pflops" not in metrics:
        raise BarterError(f"{path} records no train_pflops: retrain that run with this version")
    return float(metrics["train_pflops"])


def start_allocation(run: RunConfig, config: ModelConfig) -> Allocation:
    """Where a compact run starts: its ``start`` rule, or its given ``allocation``, which must
    hold exactly the density's budgets (core.budgets.compute_budget) within each layer's bounds."""
    budget = compute_budget(config, run.density)
    if run.allocation is None:
        return starting_allocation(config, budget, run.start)
    given = check_allocation(config, Allocation(heads=tuple(run.allocation["heads"]), ffn=tuple(run.allocation["ffn"])))
    if (sum(given.heads), sum(given.ffn)) != (budget.heads, budget.ffn):
        raise BarterError(f"the given allocation holds {sum(given.heads)} heads and {sum(given.ffn)} FFN channels; "
                          f"density {run.density:g} of {config.name} budgets {budget.heads} and {budget.ffn}")
    return given


def load_splits(run: RunConfig, recipe: Recipe) -> DataSplits:
    """The run's dataset, cut to the recipe's training and evaluation subsets."""
    splits = load_dataset(run.dataset, run.data_root, seed=run.seed, train_subset=recipe.train_subset,
                          download=run.download, classes=run.classes, img_size=run.img_size)
    if recipe.eval_subset:
        splits.val = Subset(splits.val, range(min(recipe.eval_subset, len(splits.val))))
        splits.test = Subset(splits.test, range(min(recipe.eval_subset, len(splits.test))))
    return splits


def build_run_model(run: RunConfig, config: ModelConfig, recipe: Recipe, splits: DataSplits, device: torch.device,
                    checkpoint: dict | None) -> nn.Module:
    """The run's model on ``device``: compact at the allocation it starts from (or the
    checkpoint's, whose values :func:`~barter_mini.training.trainer.resume_training` loads), full-width for a masked method,
    or cut from the dense ``init`` checkpoint (:func:`~barter_mini.training.finetune.dense_start`)."""
    method = get_method(run.method)
    if checkpoint is not None:        # the tensors as they were; their values are loaded later
        allocation = None if method.full_width else Allocation(
            **{kind: tuple(widths) for kind, widths in checkpoint["allocation"].items()})
    else:
        allocation = None if method.full_width else start_allocation(run, config)
    if run.init is None or checkpoint is not None:
        return build_model(config, method.model_density(run.density), allocation, drop_path=recipe.drop_path).to(device)
    model, reinitialised = dense_start(
        run.init, config, run.dataset, run.classes, run.density, compact=not method.full_width,
        allocation="oneshot" if method.needs_init else allocation, splits=splits,
        batch_size=recipe.batch_size, seed=run.seed, device=device, drop_path=recipe.drop_path)
    if reinitialised:
        LOG.info("%s: the classifier was re-initialised for the %d classes of this run", run.init, config.num_classes)
    return model


def run_length(run: RunConfig, recipe: Recipe, steps_per_epoch: int, gflops_per_image: float,
               checkpoint: dict | None) -> tuple[int, Recipe]:
    """The run's optimizer steps and its recipe with the epochs they span: the recipe's
    epochs, or as many steps as a compute budget (``pflops``) buys; a resumed run keeps the
    length fixed when it started."""
    if checkpoint is not None:
        return checkpoint["length"]["total_steps"], replace(recipe, epochs=checkpoint["length"]["epochs"])
    if run.pflops is None:
        return recipe.epochs * steps_per_epoch, recipe
    total_steps = steps_for_compute(run.pflops, gflops_per_image, recipe.batch_size)
    return total_steps, replace(recipe, epochs=math.ceil(total_steps / steps_per_epoch))
