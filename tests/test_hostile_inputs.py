"""Inputs made to mislead or exhaust: a tampered CIFAR-10, odd data roots, an empty cache
variable, monstrous timm model names, a fine-tuning checkpoint changed under its name.

The CIFAR-10 tests read the real decoded data (`make test` fetches it first, as for
tests/test_cifar10.py): its absence is a failure, not a skip.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from barter_mini.cli import main
from barter_mini.core.models import get_model_config, timm_vit
from barter_mini.errors import BarterError
from barter_mini.training import cache
from barter_mini.training.data import default_data_root, load_dataset
from barter_mini.training.data import cifar10
from barter_mini.training.run_config import RunConfig

from helpers import exit_status_and_stderr


def run_cli(argv, capsys) -> tuple[int, str]:
    """``barter-mini ARGV`` in-process: its exit status (argparse's refusal included) and stderr."""
    return exit_status_and_stderr(main, argv, capsys)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr, stderr
    return lines[0]


# ----------------------------------------------------------------------------- CIFAR-10's decoded arrays

CAT, DOG = 3, 5


@pytest.fixture(scope="module")
def real():
    folder = default_data_root() / cifar10.FOLDER
    assert (folder / cifar10.ARRAYS).is_file(), f"run `barter-mini data cifar10` first (make test does): {folder}"
    return folder


@pytest.fixture(scope="module")
def arrays(real):
    return cifar10.read_arrays(real / cifar10.ARRAYS)


def tampered_copy(arrays, root: Path, change: str, tarball: Path | None = None) -> Path:
    """``root/cifar10/`` holding the arrays with cat and dog swapped (``"labels"``) or one
    pixel changed (``"pixel"``), and the tarball (a link to the real one) if given."""
    changed = dict(arrays)
    if change == "labels":
        labels = arrays["train_labels"].copy()
        labels[arrays["train_labels"] == CAT], labels[arrays["train_labels"] == DOG] = DOG, CAT
        changed["train_labels"] = labels
    else:
        changed["train_images"] = arrays["train_images"].copy()
        changed["train_images"][0, 0, 0, 0] ^= 1
    folder = root / cifar10.FOLDER
    folder.mkdir(parents=True)
    with open(folder / cifar10.ARRAYS, "wb") as out:
        np.savez(out, **changed)
    if tarball is not None:
        (folder / cifar10.NPM_TARBALL).symlink_to(tarball)
    return folder / cifar10.ARRAYS


def test_the_real_decoded_arrays_have_the_pinned_digest_and_load(real, arrays):
    assert cifar10.arrays_digest(arrays) == cifar10.DECODED_SHA256
    assert len(cifar10.DECODED_SHA256) == 64
    splits = load_dataset("cifar10", real.parent, seed=0)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (45000, 5000, 10000)


def test_the_digest_is_computed_once_per_file_and_process(real, arrays, monkeypatch):
    monkeypatch.setattr(cifar10, "arrays_digest", lambda arrays: pytest.fail("hashed a verified file again"))
    assert cifar10.read_arrays(real / cifar10.ARRAYS)["train_labels"].shape == (50000,)


def test_a_copy_with_cat_and_dog_swapped_is_refused_in_one_line_and_the_data_command_mends_it(
        real, arrays, tmp_path, monkeypatch, capsys):
    path = tampered_copy(arrays, tmp_path, "labels")
    # the shapes and the class counts are CIFAR-10's: only the digest tells
    with np.load(path) as saved:
        cifar10.check_cifar10({name: saved[name] for name in saved.files}, path)
    with pytest.raises(BarterError) as refused:
        load_dataset("cifar10", tmp_path)
    message = str(refused.value)
    assert f"{path} differs from the decoded CIFAR-10" in message and "barter-mini data cifar10" in message
    assert "\n" not in message
    # the command the error names fetches the tarball (here: a link to the real one) and decodes it again
    def npm_pack(folder):
        (folder / cifar10.NPM_TARBALL).symlink_to(real / cifar10.NPM_TARBALL)
        return folder / cifar10.NPM_TARBALL

    monkeypatch.setattr(cifar10, "_npm_pack", npm_pack)
    status, err = run_cli(["data", "cifar10", "--data-root", tmp_path], capsys)
    assert status == 0 and err.startswith(f"{path} differs from the decoded CIFAR-10"), err
    with np.load(path) as mended:
        assert cifar10.arrays_digest(mended) == cifar10.DECODED_SHA256


def test_a_copy_with_one_pixel_changed_is_decoded_again_from_the_tarball(real, arrays, tmp_path, capsys):
    path = tampered_copy(arrays, tmp_path, "pixel", tarball=real / cifar10.NPM_TARBALL)
    status, err = run_cli(["data", "cifar10", "--data-root", tmp_path], capsys)
    assert status == 0, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{path} differs from the decoded CIFAR-10"), err
    assert "decoding it again" in lines[0]
    with np.load(path) as fixed:
        assert cifar10.arrays_digest(fixed) == cifar10.DECODED_SHA256


# ----------------------------------------------------------------------------- data roots


@pytest.mark.parametrize("kind", ["proc", "below-a-file", "long-name"])
def test_an_odd_data_root_is_one_line(kind, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    root = {"proc": "/proc/self", "below-a-file": tmp_path / "afile" / "data",
            "long-name": tmp_path / ("d" * 300)}[kind]
    status, err = run_cli(["data", "cifar10", "--data-root", root], capsys)
    assert status == 2 and "Traceback" not in err, err
    assert str(root)[:40] in err.strip().splitlines()[-1]
    if kind != "long-name":          # argparse's refusal adds its usage line
        one_line(err)


def test_a_data_root_whose_name_is_too_long_is_one_line_for_train_too(tmp_path, capsys):
    root = tmp_path / ("d" * 300)
    status, err = run_cli(["train", "--method", "static", "--model", "vit-mini", "--dataset", "fashion-mnist",
                           "--recipe", "smoke", "--epochs", "1", "--no-progress", "--data-root", root,
                           "--out", tmp_path / "run"], capsys)
    assert status == 2 and f"cannot use {root} as the data root" in one_line(err)
    assert not (tmp_path / "run").exists()


def test_a_data_root_without_permission_is_one_line(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    command = [sys.executable, "-m", "barter_mini.cli", "data", "cifar10", "--data-root", str(locked)]
    if os.geteuid() == 0:            # root writes in any folder: the command runs without that power
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv to drop the power to write anywhere")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.stderr.startswith("setpriv:"):
        pytest.skip(f"setpriv cannot drop capabilities here: {result.stderr.strip()}")
    assert result.returncode == 2 and str(locked) in one_line(result.stderr)
    assert "not writable (Permission denied)" in result.stderr and list(locked.iterdir()) == []


# ----------------------------------------------------------------------------- the run cache's variable


def smoke_run(**changes):
    return RunConfig(**{"method": "barter", "model": "vit-mini", "dataset": "digits", "density": 0.5,
                        "seed": 1, "recipe": "smoke", "epochs": 1, "progress": False, **changes})


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_cache_variable_is_one_line_not_the_current_folder(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cache.CACHE_ENV, value)
    monkeypatch.setattr(cache, "train", lambda *a, **k: pytest.fail("trained into the current folder"))
    for call in (cache.default_cache_dir, cache.check_cache_dir, lambda: cache.cached_train(smoke_run())):
        with pytest.raises(BarterError, match=f"{cache.CACHE_ENV} is set but empty: unset it .* or give it a folder"):
            call()
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- timm model names

TIMM = "timm:vit_tiny_patch16_224"


@pytest.fixture
def nothing_built_for_real(monkeypatch):
    """timm builds only on the meta device (which allocates nothing), if at all."""
    create = timm_vit.timm.create_model

    def meta_only(*args, **kwargs):
        assert torch.get_default_device().type == "meta", "timm built a model in memory"
        return create(*args, **kwargs)

    monkeypatch.setattr(timm_vit.timm, "create_model", meta_only)


@pytest.mark.parametrize("spec, message", [
    (f"{TIMM}:x=" + "-" * 100_000 + "1", "is 100,029 characters long: .* at most 1,000"),
    (f"{TIMM}:" + "patch_size=4," * 8_000, "characters long: .* at most 1,000"),
    (f"{TIMM}:" + ",".join(f"k{i}=1" for i in range(40)), "has 40 options: at most 32"),
    (f"{TIMM}:depth=1000000000", "depth=1000000000: numbers in an option must lie between -65,536 and 65,536"),
    (f"{TIMM}:depth=300", "depth=300: at most 256 layers"),
    (f"{TIMM}:embed_dim=10000000000", "embed_dim=10000000000: numbers in an option must lie between"),
    (f"{TIMM}:mlp_ratio=1e300", "mlp_ratio=1e300: numbers in an option"),
    (f"{TIMM}:embed_dim=60000,num_heads=4", "would hold [0-9,]+ parameters: at most 2,000,000,000"),
])
def test_monstrous_timm_names_are_refused_in_one_line_before_any_allocation(spec, message, nothing_built_for_real):
    with pytest.raises(BarterError, match=message) as refused:
        get_model_config(spec)
    assert len(str(refused.value)) < 300 and "\n" not in str(refused.value)


def test_a_monstrous_timm_name_on_the_command_line_is_one_line(capsys):
    status, err = run_cli(["describe", "--model", f"{TIMM}:x=" + "(" * 100_000], capsys)
    assert status == 2 and "at most 1,000" in one_line(err) and len(err) < 300


# ----------------------------------------------------------------------------- fine-tuning from a file


def test_the_cache_key_follows_the_init_files_content_not_its_path(tmp_path):
    first, second = tmp_path / "a" / "dense.pt", tmp_path / "b" / "renamed.pt"
    first.parent.mkdir()
    second.parent.mkdir()
    first.write_bytes(b"the first dense checkpoint")
    before = cache.run_dir(smoke_run(init=str(first)), tmp_path)
    first.write_bytes(b"a retrained dense checkpoint, same name")
    after = cache.run_dir(smoke_run(init=str(first)), tmp_path)
    assert before != after                      # a changed file under the same name trains afresh
    second.write_bytes(first.read_bytes())
    assert cache.run_dir(smoke_run(init=str(second)), tmp_path) == after    # same content: same run
