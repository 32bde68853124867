"""What each dataset is (:class:`~.DatasetInfo`, :data:`DATASETS`), the three splits of one
(:class:`~.DataSplits`), and where datasets are looked for (:func:`~.default_data_root`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from torch.utils.data import Dataset


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about a dataset.

    ``mean``/``std`` are per-channel statistics of the official training images scaled to
    [0, 1]; they are fixed constants (not recomputed per run) so that a checkpoint always sees
    the same normalisation.
    """

    name: str
    img_size: int
    in_chans: int
    num_classes: int
    mean: tuple
    std: tuple


#: every dataset a run may name, by name
DATASETS: dict[str, DatasetInfo] = {
    # Computed over the 60 000 training images: 0.28604, 0.35302.
    "fashion-mnist": DatasetInfo("fashion-mnist", 28, 1, 10, (0.2860,), (0.3530,)),
    # Computed over all 1797 images of load_digits() divided by 16: 0.30526, 0.37605.
    "digits": DatasetInfo("digits", 8, 1, 10, (0.3053,), (0.3760,)),
    # Computed over CIFAR-10's 50 000 training images: the usual statistics.
    "cifar10": DatasetInfo(
        "cifar10", 32, 3, 10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    ),
    # The usual CIFAR-100 training-set statistics.
    "cifar100": DatasetInfo(
        "cifar100", 32, 3, 100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
    ),
    # The usual Tiny-ImageNet training-set statistics.
    "tiny-imagenet": DatasetInfo(
        "tiny-imagenet", 64, 3, 200, (0.4802, 0.4481, 0.3975), (0.2302, 0.2265, 0.2262)
    ),
}


@dataclass
class DataSplits:
    """The three splits of one dataset; see the module docstring for what each one holds."""

    info: DatasetInfo
    train: Dataset  # augmented (if augment=True)
    val: Dataset  # held out of the official train split, no augmentation
    test: Dataset  # the official test split (tiny-imagenet: official val), no augmentation


def default_data_root() -> Path:
    """``$BARTER_MINI_DATA`` if set (and not empty), else the ``data/`` folder beside the package."""
    env = os.environ.get("BARTER_MINI_DATA")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[3] / "data"
