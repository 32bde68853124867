"""In-memory datasets as one uint8 tensor, augmented and normalised a whole batch at a time.

Digits, Fashion-MNIST, CIFAR-10 and CIFAR-100 fit in memory. Each is held as one
:class:`TensorImages`: ``N x C x H x W`` uint8 images (digits: their 0..16 values, so
``scale`` 16) and their labels. A batch of indices becomes a batch of normalised float
images in a few tensor operations on the device the images live on (:meth:`TensorImages.batch`):

1. gather the batch's images;
2. with ``crop_padding`` p > 0 (the training view), pad by p with zeros and cut each image's
   ``H x W`` window at its own offset in ``0 .. 2p``, then flip each with probability 1/2:
   torchvision's ``RandomCrop(padding=p)`` and ``RandomHorizontalFlip``, for every image at once;
3. ``x / scale``, then ``(x - mean) / std`` per channel (:class:`~.info.DatasetInfo`).

The offsets and flips are drawn on the CPU from the global torch generator, a few numbers
per image, so a resumed run that restores that generator draws the same augmentations, and
nothing is drawn for batches a resumed run passes over.

:func:`batch_source` sees through the views the splits are made of (``Subset``, a class
subset relabelled, resized images) to the :class:`TensorImages` beneath, so the loaders
(:mod:`.loaders`) gather every batch straight from the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F
from torch.utils.data import Dataset, Subset

from .info import DatasetInfo
from .views import Relabelled, Resized


class TensorImages(Dataset):
    """``images`` (``N x C x H x W`` uint8) and ``targets`` (``N`` long) of one dataset, with
    the normalisation of ``info`` and, for a training view, ``crop_padding`` > 0 (random
    crop with that padding and horizontal flip). :meth:`with_augmentation` makes another
    view of the same tensors; :meth:`to` moves them to a device once."""

    def __init__(self, images: torch.Tensor, targets, info: DatasetInfo, scale: float = 255.0,
                 crop_padding: int = 0):
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images must be N x C x H x W uint8, got {images.dtype} {tuple(images.shape)}")
        self.images, self.targets = images, torch.as_tensor(targets, dtype=torch.long)
        self.info, self.scale, self.crop_padding = info, float(scale), int(crop_padding)
        self._mean = torch.tensor(info.mean, device=images.device).view(1, -1, 1, 1)
        self._std = torch.tensor(info.std, device=images.device).view(1, -1, 1, 1)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        image, label = self.batch(torch.tensor([int(index)]))
        return image[0].cpu(), int(label[0])

    def with_augmentation(self, crop_padding: int) -> "TensorImages":
        """The same tensors, augmented with ``crop_padding`` (0: none)."""
        return TensorImages(self.images, self.targets, self.info, self.scale, crop_padding)

    def to(self, device: torch.device, moved: dict | None = None) -> "TensorImages":
        """This view with its tensors on ``device`` (itself if they are there already).
        ``moved`` remembers the copies made, so views of the same tensors (training and
        validation, several loaders) share one copy on the device."""
        if self.images.device == torch.device(device):
            return self
        moved = {} if moved is None else moved
        if id(self.images) not in moved:
            moved[id(self.images)] = (self.images, self.images.to(device), self.targets.to(device))
        _, images, targets = moved[id(self.images)]
        return TensorImages(images, targets, self.info, self.scale, self.crop_padding)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Images ``indices`` as normalised float32 (augmented if this is a training view) and
        their labels, on the device the tensors are on (module docstring, steps 1-3)."""
        indices = indices.to(self.images.device)
        images = self.images.index_select(0, indices)
        if self.crop_padding:
            images = random_crop_and_flip(images, self.crop_padding)
        return (images.float() / self.scale - self._mean) / self._std, self.targets.index_select(0, indices)


def random_crop_and_flip(images: torch.Tensor, padding: int) -> torch.Tensor:
    """Each image of ``images`` (``B x C x H x W``) padded by ``padding`` zeros, cut at its own
    random offset, and flipped left-right with probability 1/2; offsets and flips drawn from
    the global torch generator on the CPU."""
    count, _, height, width = images.shape
    top = torch.randint(0, 2 * padding + 1, (count,))
    left = torch.randint(0, 2 * padding + 1, (count,))
    flip = torch.rand(count) < 0.5
    device = images.device
    rows = (top[:, None] + torch.arange(height)).to(device)                   # B x H
    columns = left[:, None] + torch.arange(width)                             # B x W
    columns = torch.where(flip[:, None], columns.flip(1), columns).to(device)  # a flip reads the window backwards
    padded = F.pad(images, (padding, padding, padding, padding))
    picked = padded[torch.arange(count, device=device)[:, None, None], :, rows[:, :, None], columns[:, None, :]]
    return picked.permute(0, 3, 1, 2)                                         # B x H x W x C -> B x C x H x W


@dataclass
class BatchSource:
    """Where a split's item ``i`` comes from: item ``indices[i]`` of ``images``, its label
    mapped through ``relabel`` (a lookup tensor; None: kept) and its image resized to
    ``img_size`` (None: kept)."""

    images: TensorImages
    indices: torch.Tensor
    relabel: torch.Tensor | None = None
    img_size: int | None = None

    def __len__(self) -> int:
        return len(self.indices)

    def to(self, device: torch.device, moved: dict | None = None) -> "BatchSource":
        """This source on ``device`` (:meth:`TensorImages.to`, sharing ``moved`` copies)."""
        relabel = None if self.relabel is None else self.relabel.to(device)
        return BatchSource(self.images.to(device, moved), self.indices.to(device), relabel, self.img_size)

    def batch(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Items ``positions`` of the split, as :meth:`TensorImages.batch` gives them."""
        images, labels = self.images.batch(self.indices.index_select(0, positions.to(self.indices.device)))
        if self.relabel is not None:
            labels = self.relabel.index_select(0, labels)
        if self.img_size is not None:
            images = F.interpolate(images, size=(self.img_size, self.img_size), mode="bilinear",
                                   align_corners=False, antialias=True)
        return images, labels


def batch_source(dataset: Dataset) -> BatchSource | None:
    """``dataset`` as a :class:`BatchSource` over the :class:`TensorImages` beneath its
    views (``Subset``, :func:`~.views.select_classes`, :func:`~.views.resize_images`); None
    where there is none (Tiny-ImageNet's files on disk)."""
    if isinstance(dataset, TensorImages):
        return BatchSource(dataset, torch.arange(len(dataset)))
    if isinstance(dataset, Resized):
        inner = batch_source(dataset.dataset)
        if inner is None or inner.img_size is not None:
            return None
        inner.img_size = dataset.size
        return inner
    if isinstance(dataset, (Subset, Relabelled)):
        inner = batch_source(dataset.dataset)
        if inner is None or inner.img_size is not None:
            return None
        inner.indices = inner.indices.index_select(0, torch.as_tensor(list(dataset.indices), dtype=torch.long))
        if isinstance(dataset, Relabelled):
            lookup = torch.full((max(dataset.relabel) + 1,), -1, dtype=torch.long)
            for old, new in dataset.relabel.items():
                lookup[old] = new
            if inner.relabel is not None:        # relabelled twice: compose (-1: a label no item keeps)
                lookup = torch.where(inner.relabel >= 0, lookup[inner.relabel.clamp(0, len(lookup) - 1)], -1)
            inner.relabel = lookup
        return inner
    return None
