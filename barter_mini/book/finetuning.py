"""Fine-tuning from a pretrained dense model, and compute-matched BARTER (Figure 5, Tables 10, 11).

The paper pretrains ViT on Tiny-ImageNet and fine-tunes every method on CIFAR-100 for 100
epochs; BARTER's compact steps cost a fraction of the masked methods' full-size ones, so it
also trains *compute-matched*: as many cumulative training PFLOPs as RigL spends (906 epochs
at rho 0.1). On a CPU the transfer task runs offline on one dataset: a dense model is
pretrained on half of CIFAR-10's classes (airplane, automobile, bird, cat, deer) and every
method fine-tunes from it on the other half (dog, frog, horse, ship, truck), a new task with
a new classifier, as CIFAR-100 is for a Tiny-ImageNet model. Splitting one dataset by class
keeps the image statistics and size (so the whole backbone transfers) while the labels are
disjoint, which is what makes it transfer rather than continued training.
The ``paper`` profile runs the paper's own transfer (:data:`PAPER_TRANSFER`): ``vit-paper``
pretrained on Tiny-ImageNet, fine-tuned on CIFAR-100 resized to Tiny-ImageNet's 64 px.

Every fine-tuning run starts from the same pretrained checkpoint (per seed) through the run
cache, so the pretrained model is trained once and every method sees the same weights.
Fine-tuning halves the recipe's peak learning rate, as Table 5 does (1e-3 against 2e-3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd
from tqdm import tqdm

from ..training.cache import run_dir
from ..training.data import DATASETS
from ..training.methods import check_methods, get_method
from ..training.recipes import get_recipe
from ..training.run_config import RunConfig
from ..core.models import get_model_config
from ..errors import choose
from .experiments import profile_run
from .profiles import Profile
from .tables import settings_markdown


@dataclass(frozen=True)
class TransferTask:
    """Pretrain ``model`` on ``pretrain_dataset`` (its ``pretrain_classes``; None: all of
    them), fine-tune it on ``finetune_dataset`` (``finetune_classes``) with the images resized
    to ``img_size`` pixels (None: as they are)."""

    model: str
    pretrain_dataset: str
    pretrain_classes: tuple[int, ...] | None
    finetune_dataset: str
    finetune_classes: tuple[int, ...] | None
    img_size: int | None = None

    def _repr_markdown_(self) -> str:
        return settings_markdown(self, "The transfer", {"pretrain_classes": "all", "finetune_classes": "all",
                                                        "img_size": "as they are"})


#: Tables 10 and 11: ViT pretrained on Tiny-ImageNet, fine-tuned on all of CIFAR-100 at 64 px
#: (the size Table 11's PFLOPs imply; :func:`~barter_mini.training.data.views.resize_images`)
PAPER_TRANSFER = TransferTask(model="vit-paper", pretrain_dataset="tiny-imagenet", pretrain_classes=None,
                              finetune_dataset="cifar100", finetune_classes=None, img_size=64)


#: Table 11 matches BARTER's compute to RigL's, the strongest masked baseline
COMPUTE_REFERENCE = "rigl"
#: the two schedules of Table 11
FULL, MATCHED = "recipe epochs", "compute-matched"
#: the methods trained compute-matched: BARTER (Table 11) and Static, its control (the same
#: compact model and cost per epoch, never moving a unit): what BARTER gains from RigL's
#: compute beyond what longer training alone gives
MATCHED_METHODS = ("barter", "static")


def transfer_task(setup: Profile) -> TransferTask:
    """The profile's transfer task: on the ``paper`` profile with CIFAR-100 the paper's own
    (:data:`PAPER_TRANSFER`); otherwise pretrain on the first half of the dataset's classes and
    fine-tune on the second (CIFAR-10 0-4 -> 5-9)."""
    if setup.name == "paper" and setup.dataset == PAPER_TRANSFER.finetune_dataset:
        return PAPER_TRANSFER
    classes = DATASETS[setup.dataset].num_classes
    return TransferTask(model=setup.model, pretrain_dataset=setup.dataset, pretrain_classes=tuple(range(classes // 2)),
                        finetune_dataset=setup.dataset, finetune_classes=tuple(range(classes // 2, classes)))


def finetune_lr(setup: Profile) -> float:
    """Table 5: fine-tuning peaks at half the from-scratch learning rate."""
    return get_recipe(setup.recipe, get_model_config(transfer_task(setup).model).family).lr / 2


def pretraining_run(setup: Profile, seed: int) -> RunConfig:
    """The dense run that pretrains the task's model on its pretraining data."""
    task = transfer_task(setup)
    return replace(profile_run(setup, "dense", 1.0, seed), model=task.model, dataset=task.pretrain_dataset,
                   classes=task.pretrain_classes)


def pretrained_checkpoint(setup: Profile, seed: int) -> str:
    """The pretrained dense model (trained once, cached): its best.pt."""
    run = pretraining_run(setup, seed)
    setup.cached_train(run)
    return str(run_dir(run, setup.cache_dir) / "best.pt")


def finetune_run(setup: Profile, method: str, density: float, seed: int, pflops: float | None = None,
                 init: str | None = None) -> RunConfig:
    """``method`` fine-tuned on the task's fine-tuning data from ``init`` (default: the seed's
    pretrained checkpoint, trained if missing); with ``pflops``, trained until that much
    compute instead of the recipe's epochs."""
    task = transfer_task(setup)
    run = replace(profile_run(setup, method, density, seed), model=task.model, dataset=task.finetune_dataset,
                  init=init or pretrained_checkpoint(setup, seed), classes=task.finetune_classes,
                  img_size=task.img_size, lr=finetune_lr(setup))
    return run if pflops is None else replace(run, epochs=None, pflops=pflops)


def matched_run(setup: Profile, density: float, seed: int, method: str = "barter") -> RunConfig:
    """``method`` (one of :data:`MATCHED_METHODS`) fine-tuned until the cumulative training
    PFLOPs of :data:`COMPUTE_REFERENCE` on the same density and seed (Table 11); that run is
    read from the cache (trained if missing)."""
    choose("compute-matched method", method, MATCHED_METHODS)
    reference = setup.cached_train(finetune_run(setup, COMPUTE_REFERENCE, density, seed))
    return finetune_run(setup, method, density, seed, pflops=reference["train_pflops"])


def finetuning_runs(setup: Profile, methods, densities, seeds) -> list[RunConfig]:
    """The fine-tuning runs of :func:`run_finetuning` after the recipe's epochs, in its order."""
    methods = check_methods(methods)
    return [finetune_run(setup, m, d, s) for m in methods
            for d in ([1.0] if get_method(m).fixed_density else densities) for s in seeds]


def _row(method: str, density: float, seed: int, schedule: str, metrics: dict) -> dict:
    steps_per_epoch = metrics["history"][0]["step"]         # the first epoch is always whole
    return {"method": method, "density": density, "seed": seed, "schedule": schedule,
            "epochs": metrics["steps"] / steps_per_epoch, "pflops": metrics["train_pflops"],
            "val_acc": 100 * metrics["val_acc"], "acc": 100 * metrics["test_acc"],
            "f1": 100 * metrics["test_macro_f1"]}


def run_finetuning(setup: Profile, methods, densities, seeds, matched: bool = True,
                   progress: bool = True) -> pd.DataFrame:
    """Fine-tune every method at every density and seed (dense once, at rho 1), and, with
    ``matched``, BARTER and Static again until RigL's cumulative PFLOPs on the same seed and
    density.

    One row per run: method, density, seed, schedule (recipe epochs or compute-matched),
    epochs trained, cumulative training PFLOPs, validation and test Top-1, test macro-F1 (%).
    """
    rows = []
    for run in tqdm(finetuning_runs(setup, methods, densities, seeds), desc="fine-tuning runs", disable=not progress):
        rows.append(_row(run.method, run.density, run.seed, FULL, setup.cached_train(run)))
    if matched:
        for method, density, seed in [(m, d, s) for m in MATCHED_METHODS for d in densities for s in seeds]:
            rows.append(_row(method, density, seed, MATCHED, setup.cached_train(matched_run(setup, density, seed, method))))
    return pd.DataFrame(rows)
