"""Tests for barter_mini.training.data: real loaders over real files or files in the real on-disk format."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import barter_mini
from barter_mini.training import data as D
from barter_mini.training.data import files as data_files
from barter_mini.training.data import DATASETS, load_dataset, make_loaders
from barter_mini.errors import BarterError

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")
FASHION_NAMES = data_files.FASHION_FILES


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """No test may see the user's data-location overrides."""
    monkeypatch.delenv("BARTER_MINI_DATA", raising=False)
    monkeypatch.delenv("BARTER_MINI_FASHION_MNIST_DEBIAN", raising=False)


def _unnormalise(x: torch.Tensor, info) -> torch.Tensor:
    """Back to 0..255 pixel values."""
    mean = torch.tensor(info.mean).view(-1, 1, 1)
    std = torch.tensor(info.std).view(-1, 1, 1)
    return (x * std + mean) * 255.0


# --------------------------------------------------------------------------- IDX helpers


def _idx_bytes(arr: np.ndarray) -> bytes:
    """The IDX format: 0,0, type 0x08 (uint8), ndim, big-endian dims, then the data."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    header = bytes((0, 0, 0x08, arr.ndim)) + b"".join(struct.pack(">I", d) for d in arr.shape)
    return header + arr.tobytes()


def _write_debian_folder(folder: Path, n_train=20, n_test=10, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": np.arange(n_train, dtype=np.uint8) % 10,
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test, dtype=np.uint8) * 3) % 10,
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in arrays.items():
        with gzip.open(folder / f"{name}.gz", "wb") as f:
            f.write(_idx_bytes(arr))
    return arrays


# --------------------------------------------------------------------------- fashion-mnist (Debian)


@pytest.fixture(scope="module")
def fashion_root(tmp_path_factory):
    # make test installs the package (Makefile: data); a missing one is a failure, not a skip
    missing = [n for n in FASHION_NAMES if not (DEBIAN_FASHION / f"{n}.gz").is_file()]
    assert not missing, f"apt-get install dataset-fashion-mnist (missing {missing} in {DEBIAN_FASHION})"
    root = tmp_path_factory.mktemp("fashion-root")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("BARTER_MINI_FASHION_MNIST_DEBIAN", raising=False)
        mp.setattr(data_files, "FASHION_MNIST_DEBIAN_DIR", DEBIAN_FASHION)
        load_dataset("fashion-mnist", root)  # prepares root/FashionMNIST/raw once
    return root


def test_fashion_mnist_from_debian_sizes_shapes_labels(fashion_root):
    raw = fashion_root / "FashionMNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(FASHION_NAMES)  # no temp files left
    s = load_dataset("fashion-mnist", fashion_root, val_fraction=0.1, seed=0)
    assert (len(s.train), len(s.val), len(s.test)) == (54000, 6000, 10000)
    assert s.info == DATASETS["fashion-mnist"]
    for ds in (s.train, s.val, s.test):
        x, y = ds[0]
        assert x.dtype == torch.float32 and tuple(x.shape) == (1, 28, 28)
        assert isinstance(y, int)
    assert set(s.test.targets.tolist()) == set(range(10))
    labels = s.train.dataset.targets
    assert int(labels.min()) == 0 and int(labels.max()) == 9
    # val and train are disjoint and together cover the official train split
    tr, va = set(s.train.indices), set(s.val.indices)
    assert not tr & va and len(tr | va) == 60000
    # the same Debian files as the package's, decompressed byte for byte
    with gzip.open(DEBIAN_FASHION / "t10k-labels-idx1-ubyte.gz", "rb") as f:
        assert (raw / "t10k-labels-idx1-ubyte").read_bytes() == f.read()


def test_fashion_mnist_split_is_seeded(fashion_root):
    a = load_dataset("fashion-mnist", fashion_root, seed=0)
    b = load_dataset("fashion-mnist", fashion_root, seed=0)
    c = load_dataset("fashion-mnist", fashion_root, seed=1)
    assert list(a.val.indices) == list(b.val.indices)
    assert list(a.train.indices) == list(b.train.indices)
    assert set(a.val.indices) != set(c.val.indices)
    sub = load_dataset("fashion-mnist", fashion_root, seed=0, train_subset=100)
    assert list(sub.train.indices) == list(a.train.indices)[:100]
    assert list(sub.val.indices) == list(a.val.indices)  # val does not move with train_subset
    big = load_dataset("fashion-mnist", fashion_root, seed=0, train_subset=10**9)
    assert len(big.train) == 54000


def test_fashion_mnist_val_plain_train_augmented(fashion_root):
    s = load_dataset("fashion-mnist", fashion_root, seed=0)
    info = s.info
    torch.manual_seed(0)
    v1, v2 = s.val[3][0], s.val[3][0]
    torch.testing.assert_close(v1, v2, rtol=0, atol=0)
    # the val item is exactly the normalised raw image
    raw = s.val.dataset.images[s.val.indices[3], 0].float()
    torch.testing.assert_close(_unnormalise(v1, info)[0], raw, rtol=1e-5, atol=1e-3)
    # the training view is augmented: repeated draws of one item differ
    draws = [s.train[0][0] for _ in range(10)]
    assert any(not torch.equal(draws[0], d) for d in draws[1:])
    # ... and augment=False turns that off
    plain = load_dataset("fashion-mnist", fashion_root, seed=0, augment=False)
    torch.testing.assert_close(plain.train[0][0], plain.train[0][0], rtol=0, atol=0)


def test_fashion_mnist_prepared_from_small_debian_folder(tmp_path, monkeypatch):
    debian = tmp_path / "debian"
    arrays = _write_debian_folder(debian)
    monkeypatch.setenv("BARTER_MINI_FASHION_MNIST_DEBIAN", str(debian))
    root = tmp_path / "root"
    s = load_dataset("fashion-mnist", root, val_fraction=0.1, seed=0)
    assert (len(s.train), len(s.val), len(s.test)) == (18, 2, 10)
    raw = root / "FashionMNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(FASHION_NAMES)
    for name, arr in arrays.items():
        assert (raw / name).read_bytes() == _idx_bytes(arr)
    for k in (0, 7):
        x, y = s.test[k]
        assert y == int(arrays["t10k-labels-idx1-ubyte"][k])
        got = _unnormalise(x, s.info)[0]
        torch.testing.assert_close(got, torch.from_numpy(arrays["t10k-images-idx3-ubyte"][k]).float(),
                                   rtol=1e-5, atol=1e-3)
    # the constant is honoured too, and the env var wins over it
    monkeypatch.delenv("BARTER_MINI_FASHION_MNIST_DEBIAN")
    monkeypatch.setattr(data_files, "FASHION_MNIST_DEBIAN_DIR", debian)
    s2 = load_dataset("fashion-mnist", tmp_path / "root2")
    assert len(s2.test) == 10


def test_fashion_mnist_truncated_debian_file_leaves_nothing(tmp_path, monkeypatch):
    debian = tmp_path / "debian"
    _write_debian_folder(debian)
    good = (debian / "train-images-idx3-ubyte.gz").read_bytes()
    (debian / "train-images-idx3-ubyte.gz").write_bytes(good[: len(good) // 2])
    monkeypatch.setattr(data_files, "FASHION_MNIST_DEBIAN_DIR", debian)
    with pytest.raises(BarterError) as err:
        load_dataset("fashion-mnist", tmp_path / "root")
    assert "\n" not in str(err.value)
    raw = tmp_path / "root" / "FashionMNIST" / "raw"
    assert "train-images-idx3-ubyte" not in {p.name for p in raw.iterdir()}
    assert not [p for p in raw.iterdir() if p.name.endswith(".tmp")]


def test_fashion_mnist_missing_says_apt_get(tmp_path, monkeypatch):
    monkeypatch.setenv("BARTER_MINI_FASHION_MNIST_DEBIAN", str(tmp_path / "nowhere"))
    with pytest.raises(BarterError) as err:
        load_dataset("fashion-mnist", tmp_path / "root")
    msg = str(err.value)
    assert "\n" not in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "download" in msg


# --------------------------------------------------------------------------- CIFAR-100


class _Py2Pickler(pickle._Pickler):
    """Writes bytes as Python 2 ``str`` opcodes, as in the official CIFAR pickles.

    So the files load with ``encoding='bytes'`` as ``{b'data': ...}`` and with torchvision's
    ``encoding='latin1'`` as ``{'data': ...}``, exactly like the real ones.
    """

    dispatch = dict(pickle._Pickler.dispatch)

    def _save_py2_str(self, obj):
        n = len(obj)
        if n < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_py2_str


def _py2_pickle(obj, path: Path) -> str:
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    path.write_bytes(buf.getvalue())
    return hashlib.md5(buf.getvalue()).hexdigest()


@pytest.fixture
def cifar_root(tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR100

    rng = np.random.default_rng(1)
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    arrays = {}
    md5 = {}
    for split, n in (("train", 30), ("test", 7)):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        fine = [int(v) for v in rng.integers(0, 100, n)]
        arrays[split] = (data, fine)
        md5[split] = _py2_pickle(
            {
                b"filenames": [f"img_{i}.png".encode() for i in range(n)],
                b"batch_label": f"{split} batch".encode(),
                b"fine_labels": fine,
                b"coarse_labels": [v // 5 for v in fine],
                b"data": data,
            },
            base / split,
        )
    meta_md5 = _py2_pickle(
        {
            b"fine_label_names": [f"class_{i}".encode() for i in range(100)],
            b"coarse_label_names": [f"super_{i}".encode() for i in range(20)],
        },
        base / "meta",
    )
    monkeypatch.setattr(CIFAR100, "train_list", [["train", md5["train"]]])
    monkeypatch.setattr(CIFAR100, "test_list", [["test", md5["test"]]])
    monkeypatch.setattr(CIFAR100, "meta", {"filename": "meta", "key": "fine_label_names", "md5": meta_md5})
    return tmp_path, arrays


def test_cifar_pickles_are_in_the_real_format(cifar_root):
    root, _ = cifar_root
    with open(root / "cifar-100-python" / "train", "rb") as f:
        entry = pickle.load(f, encoding="bytes")
    assert {b"data", b"fine_labels"} <= set(entry)
    assert entry[b"data"].dtype == np.uint8 and entry[b"data"].shape == (30, 3072)


def test_cifar100_loader(cifar_root):
    root, arrays = cifar_root
    s = load_dataset("cifar100", root, val_fraction=0.2, seed=3)
    assert (len(s.train), len(s.val), len(s.test)) == (24, 6, 7)
    assert not set(s.train.indices) & set(s.val.indices)
    test_data, test_fine = arrays["test"]
    for k in (0, 5):
        x, y = s.test[k]
        assert tuple(x.shape) == (3, 32, 32) and y == test_fine[k]
        # CIFAR rows are 1024 red, 1024 green, 1024 blue values, each row-major 32 x 32
        expected = torch.from_numpy(test_data[k].reshape(3, 32, 32)).float()
        torch.testing.assert_close(_unnormalise(x, s.info), expected, rtol=1e-5, atol=1e-3)
    train_data, train_fine = arrays["train"]
    i = s.val.indices[0]
    x, y = s.val[0]
    assert y == train_fine[i]
    torch.testing.assert_close(_unnormalise(x, s.info), torch.from_numpy(train_data[i].reshape(3, 32, 32)).float(),
                               rtol=1e-5, atol=1e-3)
    assert tuple(s.train[0][0].shape) == (3, 32, 32)


def test_cifar100_missing(tmp_path):
    with pytest.raises(BarterError) as err:
        load_dataset("cifar100", tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "cifar-100-python" in msg and "download" in msg


# --------------------------------------------------------------------------- Tiny-ImageNet

TINY_WNIDS = ["n09999999", "n01443537", "n02123045"]  # deliberately not sorted in wnids.txt
TINY_COLOURS = {"n01443537": (200, 30, 30), "n02123045": (30, 200, 30), "n09999999": (30, 30, 200)}


def _jpeg(path: Path, colour, mode="RGB"):
    img = Image.new("RGB", (64, 64), colour)
    if mode != "RGB":
        img = img.convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, "JPEG", quality=95)


@pytest.fixture
def tiny_root(tmp_path):
    base = tmp_path / "tiny-imagenet-200"
    base.mkdir()
    (base / "wnids.txt").write_text("\n".join(TINY_WNIDS) + "\n")
    for w in TINY_WNIDS:
        for k in range(4):
            _jpeg(base / "train" / w / "images" / f"{w}_{k}.JPEG", TINY_COLOURS[w])
        (base / "train" / w / f"{w}_boxes.txt").write_text(
            "".join(f"{w}_{k}.JPEG\t0\t0\t63\t63\n" for k in range(4))
        )
    val = [("val_0.JPEG", "n02123045"), ("val_1.JPEG", "n09999999"), ("val_2.JPEG", "n01443537")]
    for fname, w in val:
        _jpeg(base / "val" / "images" / fname, TINY_COLOURS[w], mode="L" if fname == "val_1.JPEG" else "RGB")
    (base / "val" / "val_annotations.txt").write_text(
        "".join(f"{fname}\t{w}\t0\t0\t63\t63\n" for fname, w in val)
    )
    return tmp_path, val


def test_tiny_imagenet_loader(tiny_root):
    root, val = tiny_root
    s = load_dataset("tiny-imagenet", root, val_fraction=0.25, seed=0)
    assert s.info.num_classes == 200
    assert (len(s.train), len(s.val), len(s.test)) == (9, 3, 3)
    base_ds = s.val.dataset
    assert base_ds.classes == sorted(TINY_WNIDS)
    assert base_ds.class_to_idx == {w: i for i, w in enumerate(sorted(TINY_WNIDS))}
    # every training image's label is the sorted position of the folder it came from
    for path, label in base_ds.samples:
        assert sorted(TINY_WNIDS)[label] == Path(path).parent.parent.name
    # the pixel colour agrees with the label (plain view)
    for k in range(len(s.val)):
        x, y = s.val[k]
        assert tuple(x.shape) == (3, 64, 64)
        mean_rgb = _unnormalise(x, s.info).mean(dim=(1, 2))
        torch.testing.assert_close(mean_rgb, torch.tensor(TINY_COLOURS[sorted(TINY_WNIDS)[y]], dtype=torch.float32),
                                   rtol=1e-5, atol=4)
    # test split = official val, labels from val_annotations.txt, greyscale converted to RGB
    for k, (fname, w) in enumerate(val):
        x, y = s.test[k]
        assert y == sorted(TINY_WNIDS).index(w)
        assert tuple(x.shape) == (3, 64, 64)
    assert tuple(s.train[0][0].shape) == (3, 64, 64)


def test_tiny_imagenet_missing(tmp_path):
    with pytest.raises(BarterError) as err:
        load_dataset("tiny-imagenet", tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "tiny-imagenet-200.zip" in msg


def test_tiny_imagenet_unknown_val_wnid(tiny_root):
    root, _ = tiny_root
    ann = root / "tiny-imagenet-200" / "val" / "val_annotations.txt"
    ann.write_text(ann.read_text() + "val_0.JPEG\tn00000000\t0\t0\t1\t1\n")
    with pytest.raises(BarterError, match="n00000000"):
        load_dataset("tiny-imagenet", root)


# --------------------------------------------------------------------------- digits


def test_digits_splits():
    s = load_dataset("digits", val_fraction=0.1, seed=0)
    assert len(s.train) + len(s.val) + len(s.test) == 1797
    assert len(s.test) == 360
    src = s.train.dataset.source_index
    train = {src[i] for i in s.train.indices}
    valid = {src[i] for i in s.val.indices}
    test = set(s.test.source_index)
    assert not train & valid and not train & test and not valid & test
    assert train | valid | test == set(range(1797))
    x, y = s.val[0]
    assert tuple(x.shape) == (1, 8, 8) and x.dtype == torch.float32 and 0 <= y <= 9
    # pixel values 0..16 scaled to [0, 1], then normalised
    from sklearn.datasets import load_digits

    row = src[s.val.indices[0]]
    expected = torch.from_numpy(load_digits().images[row]).float() / 16.0
    torch.testing.assert_close(_unnormalise(x, s.info)[0] / 255.0, expected, rtol=1e-5, atol=1e-5)
    # the "official" test split is fixed, whatever the seed
    assert load_dataset("digits", seed=5).test.source_index == s.test.source_index


# --------------------------------------------------------------------------- bad input & roots


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(name="imagenet"),
        dict(name="digits", val_fraction=0),
        dict(name="digits", val_fraction=1.5),
        dict(name="digits", val_fraction=1.0),
        dict(name="digits", train_subset=0),
    ],
)
def test_bad_inputs_are_one_line_barter_errors(kwargs):
    with pytest.raises(BarterError) as err:
        load_dataset(**kwargs)
    assert isinstance(err.value, ValueError)
    msg = str(err.value)
    assert msg and "\n" not in msg


def test_unknown_dataset_lists_choices():
    with pytest.raises(BarterError, match="fashion-mnist"):
        load_dataset("mnist")


def test_default_data_root(monkeypatch, tmp_path):
    assert D.default_data_root() == Path(barter_mini.__file__).resolve().parents[1] / "data"
    monkeypatch.setenv("BARTER_MINI_DATA", str(tmp_path))
    assert D.default_data_root() == tmp_path


# --------------------------------------------------------------------------- loaders


def test_make_loaders_shapes_and_seeded_order():
    s = load_dataset("digits", seed=0)
    tr, va, te = make_loaders(s, batch_size=64, seed=7)
    x, y = next(iter(tr))
    assert tuple(x.shape) == (64, 1, 8, 8) and tuple(y.shape) == (64,)
    assert len(tr) == len(s.train) // 64  # drop_last
    assert sum(len(b[1]) for b in va) == len(s.val)  # val keeps every item, in order
    torch.testing.assert_close(torch.cat([b[1] for b in te]), torch.as_tensor(s.test.targets), rtol=0, atol=0)
    x2, y2 = next(iter(make_loaders(s, batch_size=64, seed=7)[0]))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = next(iter(make_loaders(s, batch_size=64, seed=8)[0]))
    assert not torch.equal(x, x3)
    # a training set smaller than one batch still yields that one batch
    tiny = load_dataset("digits", seed=0, train_subset=5)
    batches = list(make_loaders(tiny, batch_size=64, seed=0)[0])
    assert len(batches) == 1 and len(batches[0][1]) == 5
    with pytest.raises(BarterError):
        make_loaders(s, batch_size=0, seed=0)


# --------------------------------------------------------------------------- the batched pipeline


def test_a_batch_is_cropped_and_flipped_as_torchvision_does_each_image():
    """random_crop_and_flip: each image padded with zeros, cut at its own offset, maybe flipped:
    torchvision's crop and hflip of that image with the same draws."""
    from torchvision.transforms.v2 import functional as TF

    from barter_mini.training.data.batches import random_crop_and_flip

    images = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8)
    torch.manual_seed(3)
    batch = random_crop_and_flip(images, 2)
    torch.manual_seed(3)
    top, left, flip = torch.randint(0, 5, (16,)), torch.randint(0, 5, (16,)), torch.rand(16) < 0.5
    for i in range(16):
        expected = TF.crop(TF.pad(images[i], [2]), int(top[i]), int(left[i]), 8, 8)
        torch.testing.assert_close(batch[i], TF.horizontal_flip(expected) if flip[i] else expected, rtol=0, atol=0)
    assert flip.any() and not flip.all() and len(set(top.tolist())) > 1


def test_batched_loaders_yield_what_the_items_are():
    """Validation and test batches are the plain items, exactly, in order, and every pass
    is the same (no augmentation); training batches follow the seeded order."""
    s = load_dataset("digits", seed=0, classes=(3, 1, 4), img_size=12)
    train, val, test = make_loaders(s, batch_size=32, seed=5)
    for loader, split in ((val, s.val), (test, s.test)):
        images, labels = map(torch.cat, zip(*loader))
        items = [split[i] for i in range(len(split))]
        torch.testing.assert_close(images, torch.stack([x for x, _ in items]), rtol=0, atol=0)
        assert labels.tolist() == [y for _, y in items] and set(labels.tolist()) == {0, 1, 2}
        assert tuple(images.shape[1:]) == (1, 12, 12)
        again = torch.cat([x for x, _ in loader])
        assert torch.equal(images, again)
    state = train.generator.get_state()
    order = list(train.batch_sampler)             # draws the epoch's shuffle: set it back
    train.generator.set_state(state)
    first_images, first_labels = next(iter(train))
    assert first_labels.tolist() == [s.train[i][1] for i in order[0]]
    torch.testing.assert_close(first_images, torch.stack([s.train[i][0] for i in order[0]]), rtol=0, atol=0)


def test_the_training_view_is_augmented_per_image_and_lives_where_asked(fashion_root):
    s = load_dataset("fashion-mnist", fashion_root, seed=0, train_subset=256)
    train, val, _ = make_loaders(s, batch_size=64, seed=0, device="cpu")
    torch.manual_seed(0)
    a, _ = next(iter(train))
    torch.manual_seed(1)
    b, _ = next(iter(train))
    assert a.device.type == "cpu" and a.dtype == torch.float32 and tuple(a.shape) == (64, 1, 28, 28)
    differs = (a != b).flatten(1).any(dim=1)
    assert differs.float().mean() > 0.5           # each image draws its own crop and flip
    plain = load_dataset("fashion-mnist", fashion_root, seed=0, train_subset=256, augment=False)
    c, _ = next(iter(make_loaders(plain, batch_size=64, seed=0)[0]))
    d, _ = next(iter(make_loaders(plain, batch_size=64, seed=0)[0]))
    assert torch.equal(c, d)


def test_views_of_the_same_images_share_one_copy_on_the_device():
    from barter_mini.training.data.batches import TensorImages, batch_source

    s = load_dataset("digits", seed=0)
    moved: dict = {}
    train, val = (batch_source(split).to("meta", moved) for split in (s.train, s.val))
    assert train.images.images.device.type == "meta" and train.images.images is val.images.images
    assert len(moved) == 1 and isinstance(train.images, TensorImages)


def test_files_load_in_worker_processes_and_a_resumed_epoch_draws_the_same_augmentations(tiny_root):
    """Tiny-ImageNet's DataLoader: every image augmented under its own seed, so two worker
    processes give what one process gives, and skipping batches (resume) leaves the rest as
    they were."""
    root, _ = tiny_root
    s = load_dataset("tiny-imagenet", root, val_fraction=0.25, seed=0)

    def epoch(num_workers: int, skip: int = 0) -> list[torch.Tensor]:
        train = make_loaders(s, batch_size=3, seed=4, num_workers=num_workers)[0]
        train.batch_sampler.skip = skip
        return [x for x, _ in train]

    whole = epoch(0)
    assert len(whole) == 3 and not torch.equal(whole[0][0], whole[0][1])
    for a, b in zip(whole, epoch(2)):
        assert torch.equal(a, b)
    for a, b in zip(whole[2:], epoch(2, skip=2)):
        assert torch.equal(a, b)
    again = make_loaders(s, batch_size=3, seed=4, num_workers=0)[0]
    first = [x for x, _ in again]
    assert any(not torch.equal(a, b) for a, b in zip(first, [x for x, _ in again]))   # a new epoch, new draws
