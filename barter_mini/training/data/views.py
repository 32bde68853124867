"""Views of loaded splits: a subset of the classes relabelled ``0..k-1``
(:func:`~.select_classes`, from the text :func:`~.parse_classes` reads) and images resized
(:func:`~.resize_images`). Labels are read from ``.targets``, so no image is decoded to choose."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.utils.data import Dataset, Subset

from ...errors import BarterError, check_integer
from .info import DataSplits

def parse_classes(text: str) -> tuple[int, ...]:
    """``"0-4"`` or ``"5,6,7"`` (or a mix, ``"0-2,7"``) as a tuple of class indices."""
    classes = []
    try:
        for part in str(text).split(","):
            low, _, high = part.strip().partition("-")
            classes += range(int(low), int(high) + 1) if high else [int(low)]
    except ValueError:
        raise BarterError(f"classes {text!r}: give indices and ranges such as 0-4 or 5,6,7") from None
    return tuple(classes)


def _labels(dataset: Dataset) -> list[int]:
    """Every item's label, read from ``.targets`` (no image is decoded)."""
    if isinstance(dataset, Subset):
        inner = _labels(dataset.dataset)
        return [inner[i] for i in dataset.indices]
    return [int(t) for t in dataset.targets]


class Relabelled(Dataset):
    """Items ``indices`` of ``dataset`` with label ``y`` replaced by ``relabel[y]``."""

    def __init__(self, dataset: Dataset, indices: list[int], relabel: dict[int, int]):
        self.dataset, self.indices, self.relabel = dataset, indices, relabel
        inner = _labels(dataset)
        self.targets = [relabel[inner[i]] for i in indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int):
        image, label = self.dataset[self.indices[index]]
        return image, self.relabel[int(label)]


def select_classes(splits: DataSplits, classes) -> DataSplits:
    """The splits restricted to ``classes`` (distinct indices of the dataset's classes),
    relabelled ``0..k-1`` in the order given; ``info.num_classes`` becomes ``k``."""
    classes = tuple(int(c) for c in classes)
    total = splits.info.num_classes
    if not classes or len(set(classes)) != len(classes) or not all(0 <= c < total for c in classes):
        raise BarterError(f"classes {list(classes)}: give distinct class indices in 0..{total - 1}")
    relabel = {c: i for i, c in enumerate(classes)}

    def keep(dataset):
        return Relabelled(dataset, [i for i, y in enumerate(_labels(dataset)) if y in relabel], relabel)

    info = replace(splits.info, num_classes=len(classes))
    return DataSplits(info, keep(splits.train), keep(splits.val), keep(splits.test))


class Resized(Dataset):
    """``dataset`` with every image resized to ``size`` x ``size`` (bilinear, antialiased)."""

    def __init__(self, dataset: Dataset, size: int):
        self.dataset, self.size = dataset, size
        self.targets = _labels(dataset)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        image, label = self.dataset[index]
        resized = torch.nn.functional.interpolate(image.unsqueeze(0), size=(self.size, self.size), mode="bilinear",
                                                  align_corners=False, antialias=True)
        return resized.squeeze(0), label


def resize_images(splits: DataSplits, img_size: int) -> DataSplits:
    """The splits with images resized to ``img_size`` pixels a side, after augmentation and
    normalisation (both commute with a resize up to the crop's padding), so that one model
    fine-tunes on another dataset's images at its pretraining size: the paper's ViT
    pretrained on Tiny-ImageNet (64 px) fine-tunes on CIFAR-100 (32 px); Table 11's compute,
    15.276 PFLOPs for RigL's 100 epochs of 45,000 images, is the cost of 64-px images."""
    img_size = check_integer("img_size", img_size)
    if img_size == splits.info.img_size:
        return splits
    info = replace(splits.info, img_size=img_size)
    return DataSplits(info, Resized(splits.train, img_size), Resized(splits.val, img_size),
                      Resized(splits.test, img_size))
