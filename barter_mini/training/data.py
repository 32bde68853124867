"""Real image-classification datasets for the small vision transformers.

Every dataset comes from a real loader: torchvision's dataset classes (Fashion-MNIST,
CIFAR-100, ``ImageFolder`` for Tiny-ImageNet), scikit-learn's bundled ``load_digits``, or a
few lines reading Tiny-ImageNet's official validation annotations. Nothing here invents data.

Each dataset is cut into three splits (see :class:`DataSplits`):

* ``train`` -- the official training split minus the validation part, augmented when asked;
* ``val``   -- a seeded random ``val_fraction`` of the official training split, disjoint from
  ``train`` and *never* augmented (model selection must not see random crops);
* ``test``  -- the official test split (Tiny-ImageNet has no labelled test split, so its
  official ``val`` folder plays that role), never augmented.

``train`` and ``val`` are :class:`torch.utils.data.Subset` views with disjoint index sets over
two dataset objects that read the same files: one with the augmenting transform, one plain.
The plain one is made first and the augmented one is a shallow copy with another transform,
so the decoded arrays (150 MB for CIFAR-100) are held once.

Items are ``(float tensor C x H x W normalised with DatasetInfo.mean/std, int label)``.

``classes`` keeps only some of a dataset's classes, relabelled ``0..k-1`` in the order given
(:func:`select_classes`): two disjoint halves of Fashion-MNIST make a transfer task that runs
offline, pretraining on one half and fine-tuning on the other (the fine-tuning chapter).

Where files are looked for: ``root`` (default :func:`default_data_root`); see
``data/README.md`` for the layout of each dataset and how to obtain it.
"""

from __future__ import annotations

import copy
import gzip
import os
import pathlib
import tempfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler, Subset

from ..errors import BarterError, check_in_range, check_integer, choose

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "DataSplits",
    "TinyImageNetVal",
    "default_data_root",
    "load_dataset",
    "GlobalBatchSampler",
    "make_loaders",
    "parse_classes",
    "select_classes",
    "resize_images",
    "FASHION_MNIST_DEBIAN_DIR",
    "TINY_IMAGENET_URL",
]

#: Where Debian's ``dataset-fashion-mnist`` package puts the four gzipped IDX files. The
#: environment variable ``BARTER_MINI_FASHION_MNIST_DEBIAN`` overrides it (read at call time),
#: and tests may also monkeypatch this constant.
FASHION_MNIST_DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")

#: The official Tiny-ImageNet archive (Stanford CS231n) and its md5, as used by ``download=True``.
TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
TINY_IMAGENET_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"

_FASHION_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


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


DATASETS: dict[str, DatasetInfo] = {
    # Computed over the 60 000 training images: 0.28604, 0.35302.
    "fashion-mnist": DatasetInfo("fashion-mnist", 28, 1, 10, (0.2860,), (0.3530,)),
    # Computed over all 1797 images of load_digits() divided by 16: 0.30526, 0.37605.
    "digits": DatasetInfo("digits", 8, 1, 10, (0.3053,), (0.3760,)),
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


def default_data_root() -> pathlib.Path:
    """``$BARTER_MINI_DATA`` if set (and not empty), else the ``data/`` folder beside the package."""
    env = os.environ.get("BARTER_MINI_DATA")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[2] / "data"


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


# --------------------------------------------------------------------------- fashion-mnist


def _fashion_debian_dir() -> Path:
    env = os.environ.get("BARTER_MINI_FASHION_MNIST_DEBIAN")
    return Path(env).expanduser() if env else Path(FASHION_MNIST_DEBIAN_DIR)


def _check_idx(path: Path, name: str) -> None:
    """Check that ``path`` is a complete uint8 IDX file of the kind ``name`` promises."""
    ndim = 3 if "images" in name else 1
    with open(path, "rb") as f:
        header = f.read(4 + 4 * ndim)
    size = path.stat().st_size
    ok = len(header) == 4 + 4 * ndim and header[:4] == bytes((0, 0, 0x08, ndim))
    if ok:
        dims = [int.from_bytes(header[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
        ok = size == len(header) + int(np.prod(dims))
    if not ok:
        raise BarterError(f"{path} is not a complete uint8 IDX file ({name}); reinstall dataset-fashion-mnist")


def _atomic_gunzip(src: Path, dst: Path) -> None:
    """Decompress ``src`` (gzip, or plain if it does not end in .gz) to ``dst`` atomically.

    Writes a temp file in ``dst``'s folder, checks it is a whole IDX file, then ``os.replace``s
    it into place, so an interrupted run never leaves a half file that torchvision would read.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            opener = gzip.open if src.suffix == ".gz" else open
            try:
                with opener(src, "rb") as inp:
                    while chunk := inp.read(1 << 20):
                        out.write(chunk)
            except (OSError, EOFError, zlib.error) as exc:
                raise BarterError(f"cannot read {src} ({exc}); reinstall dataset-fashion-mnist") from None
            out.flush()
            os.fsync(out.fileno())
        _check_idx(Path(tmp), dst.name)
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _prepare_fashion_from_debian(raw: Path) -> bool:
    """Fill ``raw`` (``root/FashionMNIST/raw``) from the Debian package's files, if present.

    torchvision's ``MNIST._check_exists`` wants the four *decompressed* files
    (``train-images-idx3-ubyte`` ...) in ``raw``; the Debian package ships them gzipped.
    Returns False when the Debian folder lacks any of the four files.
    """
    debian = _fashion_debian_dir()
    sources = {}
    for name in _FASHION_FILES:
        for cand in (debian / f"{name}.gz", debian / name):
            if cand.is_file():
                sources[name] = cand
                break
        else:
            return False
    raw.mkdir(parents=True, exist_ok=True)
    for name in _FASHION_FILES:
        if not (raw / name).is_file():
            _atomic_gunzip(sources[name], raw / name)
    return True


def _load_fashion_mnist(info, root: Path, augment, download, val_fraction, seed, train_subset):
    from torchvision.datasets import FashionMNIST

    raw = root / "FashionMNIST" / "raw"
    ready = all((raw / name).is_file() for name in _FASHION_FILES)
    if not ready:
        ready = _prepare_fashion_from_debian(raw)
    if not ready and download:
        FashionMNIST(root, train=True, download=True)  # torchvision's own download into raw/
        ready = True
    if not ready:
        raise BarterError(
            f"Fashion-MNIST not found in {raw} nor in {_fashion_debian_dir()}: "
            "run `apt-get install dataset-fashion-mnist` or pass download=True (--download)"
        )
    plain = _transforms(info, False, 0)
    train_plain = FashionMNIST(root, train=True, download=False, transform=plain)
    test = FashionMNIST(root, train=False, download=False, transform=plain)
    train_aug = _with_transform(train_plain, _transforms(info, True, 2)) if augment else train_plain
    return _splits(info, train_aug, train_plain, test, val_fraction, seed, train_subset)


# --------------------------------------------------------------------------- digits


class _TensorImages(Dataset):
    """Already-normalised image tensors with integer labels (used for scikit-learn digits).

    ``source_index[i]`` is the row of item ``i`` in ``load_digits()``, to trace items back.
    """

    def __init__(self, images: torch.Tensor, labels: np.ndarray, source_index: np.ndarray):
        self.images = images
        self.targets = [int(y) for y in labels]
        self.source_index = [int(i) for i in source_index]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.images[index], self.targets[index]


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
    x = torch.from_numpy(digits.images.astype(np.float32) / 16.0).unsqueeze(1)
    mean = torch.tensor(info.mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(info.std, dtype=torch.float32).view(1, -1, 1, 1)
    x = (x - mean) / std
    y = digits.target
    tr, te = train_test_split(np.arange(len(y)), test_size=0.2, stratify=y, random_state=0)
    train = _TensorImages(x[tr], y[tr], tr)
    test = _TensorImages(x[te], y[te], te)
    return _splits(info, train, train, test, val_fraction, seed, train_subset)


# --------------------------------------------------------------------------- cifar100


def _load_cifar100(info, root: Path, augment, download, val_fraction, seed, train_subset):
    """torchvision's ``CIFAR100`` (python version), with its md5 integrity check left on."""
    from torchvision.datasets import CIFAR100

    plain = _transforms(info, False, 0)
    try:
        train_plain = CIFAR100(root, train=True, download=download, transform=plain)
        test = CIFAR100(root, train=False, download=False, transform=plain)
    except RuntimeError:
        raise BarterError(
            f"CIFAR-100 not found or corrupted in {root / CIFAR100.base_folder}: put the python version "
            f"there (extract cifar-100-python.tar.gz under {root}) or pass download=True (--download)"
        ) from None
    train_aug = _with_transform(train_plain, _transforms(info, True, 4)) if augment else train_plain
    return _splits(info, train_aug, train_plain, test, val_fraction, seed, train_subset)


# --------------------------------------------------------------------------- tiny-imagenet


def _read_wnids(path: Path) -> list[str]:
    wnids = sorted({line.strip() for line in path.read_text().splitlines() if line.strip()})
    if not wnids:
        raise BarterError(f"{path} lists no class ids: it should hold one wnid per line")
    return wnids


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
    wnids = _read_wnids(base / "wnids.txt")
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
    """Load ``name`` from ``root`` (default :func:`default_data_root`) as train/val/test.

    ``val_fraction`` of the official training split (seeded by ``seed``) becomes ``val``;
    ``train_subset=N`` keeps only N training items (for quick CPU runs; more than available
    means all). ``augment`` turns on crop+flip for the training view (ignored for digits).
    ``download`` lets torchvision fetch a missing dataset (needs internet); without it a
    missing dataset is a one-line :class:`~barter_mini.errors.BarterError` that says how to get it.
    ``classes`` keeps only those classes (:func:`select_classes`, after ``train_subset``);
    ``img_size`` resizes every image to that side (:func:`resize_images`).
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
    root = Path(root).expanduser() if root is not None else default_data_root()
    loader = {
        "fashion-mnist": _load_fashion_mnist,
        "cifar100": _load_cifar100,
        "tiny-imagenet": _load_tiny_imagenet,
    }[name]
    try:
        return loader(info, root, augment, download, val_fraction, seed, train_subset)
    except OSError as error:        # a root that is no folder of ours (/proc/self), unreadable files
        where = f" at {error.filename}" if error.filename else ""
        raise BarterError(f"cannot read or prepare {name} under the data root {root} "
                          f"({error.strerror or type(error).__name__}{where}): give a --data-root that "
                          "holds the dataset, or a folder you may write in") from None


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


class _Relabelled(Dataset):
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
        return _Relabelled(dataset, [i for i, y in enumerate(_labels(dataset)) if y in relabel], relabel)

    info = replace(splits.info, num_classes=len(classes))
    return DataSplits(info, keep(splits.train), keep(splits.val), keep(splits.test))


class _Resized(Dataset):
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
    return DataSplits(info, _Resized(splits.train, img_size), _Resized(splits.val, img_size),
                      _Resized(splits.test, img_size))


class GlobalBatchSampler(Sampler[list[int]]):
    """Shuffled global batches cut into this process's share, resumable inside an epoch.

    Every epoch draws one permutation of the training split from the loader's generator
    (:class:`~torch.utils.data.RandomSampler`, the same draws as ``shuffle=True``) and cuts it
    into global batches of ``batch_size``. Process ``rank`` of ``world_size`` takes positions
    ``rank, rank + world_size, ...`` of each global batch, so the processes of a
    data-parallel run together see exactly the batches a single process would, and the
    mean of their gradients is the single process's gradient.

    ``skip`` (set before iterating) passes over that many batches at the start of the next
    epoch without loading them: a resumed run continues inside an epoch without drawing the
    augmentations' random numbers of the batches it already trained on.
    """

    def __init__(self, sampler: Sampler[int], batch_size: int, drop_last: bool,
                 rank: int = 0, world_size: int = 1):
        self.batches = BatchSampler(sampler, batch_size, drop_last)
        if batch_size % world_size:
            raise BarterError(f"a global batch of {batch_size} cannot be split evenly over {world_size} processes: "
                              "choose a batch size that is a multiple of the number of processes")
        self.rank, self.world_size, self.skip = rank, world_size, 0

    def __iter__(self):
        skip, self.skip = self.skip, 0
        for index, batch in enumerate(self.batches):
            if index >= skip:
                yield batch[self.rank::self.world_size]

    def __len__(self) -> int:
        return len(self.batches)


def make_loaders(
    splits: DataSplits, batch_size: int, seed: int, num_workers: int = 0, rank: int = 0, world_size: int = 1,
) -> tuple[DataLoader, DataLoader, DataLoader]:
    """(train, val, test) DataLoaders.

    The training loader shuffles with its own ``torch.Generator`` seeded by ``seed``, so the
    batch order is reproducible and independent of the global RNG; it drops the last partial
    batch only when at least one full batch exists (a tiny ``train_subset`` still trains).
    Its batches are :class:`GlobalBatchSampler`'s: ``batch_size`` is the global batch, of
    which process ``rank`` of ``world_size`` loads its share; of validation and test it
    loads every ``world_size``-th image from ``rank`` on, so together they see each once.
    The random crops/flips themselves draw from the global torch RNG when ``num_workers=0``
    (seed it with ``torch.manual_seed``) and from per-worker seeds derived from the loader's
    generator otherwise. Validation and test are not shuffled and keep every item.
    """
    batch_size = check_integer("batch_size", batch_size)
    num_workers = check_integer("num_workers", num_workers, minimum=0)
    common = dict(num_workers=num_workers, persistent_workers=num_workers > 0)
    generator = torch.Generator().manual_seed(int(seed))
    drop_last = len(splits.train) >= batch_size
    if not drop_last and world_size > 1:
        raise BarterError(f"{len(splits.train)} training images make no global batch of {batch_size}: "
                          "a data-parallel run needs at least one full batch")
    batches = GlobalBatchSampler(RandomSampler(splits.train, generator=generator), batch_size, drop_last,
                                 rank, world_size)
    train = DataLoader(splits.train, batch_sampler=batches, generator=generator, **common)
    def share(split: Dataset) -> Dataset:       # every process evaluates its own images
        return split if world_size == 1 else Subset(split, range(rank, len(split), world_size))
    val = DataLoader(share(splits.val), batch_size=batch_size, shuffle=False, **common)
    test = DataLoader(share(splits.test), batch_size=batch_size, shuffle=False, **common)
    return train, val, test
