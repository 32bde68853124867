"""Inputs of a shared machine that must never cost a run or print a traceback: model options
that would load a file, damaged JSON of any depth, settings read from a file, a full disk,
paths the system refuses, array headers that lie, and control characters in paths.

Every refusal on the command line is exit status 2 and one ``error: ...`` line (argparse's
refusal of a flag: its usage, then one error line), before any work where the input is
given on the command line.
"""

import errno
import json
import os
import zipfile
from pathlib import Path
from unittest import mock

import nbformat
import numpy as np
import pytest
import timm
import torch

from barter_mini.core.models import get_model_config, timm_vit
from barter_mini.errors import BarterError
import barter_mini.book.build as book_build
import barter_mini.training.checkpoints as checkpoints
from barter_mini.training import cache
from barter_mini.training.checkpoints import read_json, write_json

from test_adversarial import SMOKE, TIMM_SPEC, one_line, run_cli

#: a JSON document nested far beyond Python's recursion limit
NESTED = "[" * 100_000


def cli(argv, capsys) -> tuple[int, str]:
    """:func:`run_cli`, argparse's refusal (SystemExit) included."""
    try:
        return run_cli(argv, capsys)
    except SystemExit as exit_:
        return exit_.code, capsys.readouterr().err


# ----------------------------------------------------------------------------- model options that load files

@pytest.mark.parametrize("option", ["checkpoint_path=WEIGHTS", "pretrained=True", "pretrained_cfg='x'",
                                    "pretrained_cfg_overlay={'file':'WEIGHTS'}", "cache_dir='/tmp'",
                                    "pretrained_strict=False"])
def test_a_model_option_that_loads_weights_is_refused_before_training(option, tmp_path, capsys, monkeypatch):
    """``--model timm:ARCH:...,checkpoint_path=FILE`` once trained to the end and then refused
    its own best.pt; now the name is refused as it is parsed, and nothing is trained."""
    weights = tmp_path / "vit.pth"
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, patch_size=2, embed_dim=96, num_heads=6,
                            depth=3, img_size=8, in_chans=1, num_classes=10)
    torch.save(vit.state_dict(), weights)
    spec = f"{TIMM_SPEC},img_size=8,in_chans=1,num_classes=10,{option.replace('WEIGHTS', str(weights))}"

    def no_loading(*args, **kwargs):
        raise AssertionError("timm loaded weights named by a model option")
    monkeypatch.setattr(timm.models._factory, "load_checkpoint", no_loading)
    status, err = run_cli(["train", "--method", "dense", "--model", spec, *SMOKE, "--out", tmp_path / "run"], capsys)
    line = one_line(err)
    assert status == 2 and option.partition("=")[0] in line and "--init" in line, err
    assert not (tmp_path / "run").exists()
    with pytest.raises(BarterError, match="may not load weights"):
        get_model_config(spec)


def test_the_command_line_and_a_checkpoint_share_one_rule_of_loading_options():
    from barter_mini.training import checkpoint_contents

    assert checkpoint_contents.loads_weights is timm_vit.loads_weights
    assert all(map(timm_vit.loads_weights, ("checkpoint_path", "cache_dir", "pretrained_cfg_overlay",
                                            "pretrained_filter_fn")))
    assert not any(map(timm_vit.loads_weights, ("patch_size", "img_size", "qkv_bias", "drop_path_rate")))


# ----------------------------------------------------------------------------- damaged JSON of any depth

@pytest.mark.parametrize("text", [NESTED, "{\"a\":" * 100_000, "1" * 10_000, "[1, 2"])
def test_a_damaged_json_file_of_any_depth_is_one_line_naming_it(text, tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(text)
    with pytest.raises(BarterError) as error:
        read_json(path)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_a_deeply_nested_completion_record_is_a_damaged_entry(tmp_path):
    """A cache entry whose complete.json nests beyond the recursion limit: "damaged", trained again."""
    entry = tmp_path / "static-entry"
    entry.mkdir()
    (entry / cache.COMPLETION_RECORD).write_text(NESTED)
    (entry / "metrics.json").write_text(NESTED)
    state, why = cache.entry_state(entry)
    assert state == "damaged" and why


def test_a_deeply_nested_metrics_json_is_one_line_at_every_reader(tmp_path, capsys):
    matched = tmp_path / "matched"
    matched.mkdir()
    (matched / "metrics.json").write_text(NESTED)
    status, err = run_cli(["train", "--method", "barter", *SMOKE, "--match-compute", matched,
                           "--out", tmp_path / "cm"], capsys)
    assert status == 2 and str(matched / "metrics.json") in one_line(err)

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / "metrics.json").write_text(NESTED)
    status, err = run_cli(["train", "--method", "barter", *SMOKE, "--resume", "--out", resumed], capsys)
    assert status == 2 and str(resumed / "metrics.json") in one_line(err)


@pytest.mark.parametrize("value", [NESTED, "[" * 500 + "]" * 500, "1" * 10_000])
def test_a_nested_parameter_value_is_one_error_line(value, capsys):
    status, err = cli(["sweep", "--book", "smoke", "--dry-run", "--parameter", f"seeds={value}"], capsys)
    lines = err.strip().splitlines()
    assert status == 2 and "Traceback" not in err, err[-2000:]
    assert [line for line in lines if "error:" in line] == lines[-1:] and "seeds" in lines[-1], err[-2000:]
    assert len(lines[-1]) < 400


# ----------------------------------------------------------------------------- settings read from files

@pytest.mark.parametrize("value", ["abc", None, [1], -1, 0])
def test_a_matched_runs_pflops_that_is_no_positive_number_is_refused_naming_its_file(value, tmp_path, capsys):
    matched = tmp_path / "matched"
    matched.mkdir()
    (matched / "metrics.json").write_text(json.dumps({"train_pflops": value}))
    status, err = run_cli(["train", "--method", "barter", "--dataset", "digits", "--recipe", "smoke", "--no-progress",
                           "--match-compute", matched, "--out", tmp_path / "cm"], capsys)
    assert status == 2 and str(matched / "metrics.json") in one_line(err)
    assert not (tmp_path / "cm").exists()


# ----------------------------------------------------------------------------- one line, no traceback

TRAIN = ["train", "--method", "barter", *SMOKE]


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def torch_fell_short(checkpoint, tmp):
    """What torch's zip writer raises on a full disk: the errno is gone."""
    Path(tmp).write_bytes(b"PK\x03\x04 half a checkpoint")
    raise RuntimeError("[enforce fail at inline_container.cc:778] . unexpected pos 2368 vs 2262")


@pytest.mark.parametrize("how", ["errno", "torch"])
def test_a_full_disk_during_a_checkpoint_write_is_one_line_and_leaves_no_temporary_file(how, tmp_path, capsys,
                                                                                        monkeypatch):
    if how == "errno":
        monkeypatch.setattr(torch, "save", no_space)
    else:
        monkeypatch.setattr(torch, "save", torch_fell_short)
        monkeypatch.setattr(os, "statvfs", lambda path: mock.Mock(f_bavail=0, f_frsize=4096))
    out = tmp_path / "run"
    status, err = run_cli([*TRAIN, "--out", out], capsys)
    line = one_line(err)
    assert status == 2 and line.startswith("error: no space left on /") and str(out) in line, err
    assert "the last checkpoint is intact" in line
    assert not list(out.glob(".*.pt.*"))            # the temporary file is removed


def test_a_full_disk_during_a_json_write_is_one_line_and_the_old_file_is_intact(tmp_path, monkeypatch):
    path = write_json(tmp_path / "metrics.json", {"test_acc": 0.5})
    monkeypatch.setattr(json, "dump", no_space)
    with pytest.raises(BarterError, match=r"^no space left on /.* while writing .*metrics.json; an earlier "
                                          r"metrics.json is intact") as error:
        write_json(path, {"test_acc": 0.9})
    assert "\n" not in str(error.value) and read_json(path) == {"test_acc": 0.5}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_an_out_path_too_long_or_in_a_loop_of_links_is_one_line(tmp_path, capsys):
    long = tmp_path / ("d" * 5000)
    status, err = run_cli([*TRAIN, "--out", long], capsys)
    assert status == 2 and "File name too long" in one_line(err) and len(err) < 600
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    status, err = run_cli([*TRAIN, "--out", tmp_path / "loop" / "run"], capsys)
    assert status == 2 and str(tmp_path / "loop") in one_line(err)
    for command in (["export", tmp_path, "--out", long / "model.pt"],
                    ["bench", "--methods", "static", "--densities", "0.5", "--out", long / "rows.json"]):
        status, err = cli(command, capsys)
        lines = err.strip().splitlines()
        assert status == 2 and "Traceback" not in err and "File name too long" in lines[-1], err[-2000:]


def crafted_npz(path: Path, claimed: int) -> None:
    """CIFAR-10's arrays file whose first array's header claims ``claimed`` bytes and holds 100."""
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name in ("train_images", "train_labels", "test_images", "test_labels"):
            with archive.open(f"{name}.npy", "w") as member:
                shape = (claimed,) if name == "train_images" else (10,)
                np.lib.format.write_array_header_1_0(member, {"descr": "|u1", "fortran_order": False,
                                                              "shape": shape})
                member.write(b"\0" * 100)


def test_an_array_header_larger_than_memory_is_one_line_saying_the_file_is_damaged(tmp_path, capsys):
    arrays = tmp_path / "data" / "cifar10" / "cifar10-uint8.npz"
    crafted_npz(arrays, 86_000_000_000)
    status, err = run_cli(["train", "--method", "static", "--dataset", "cifar10", "--data-root", tmp_path / "data",
                           "--recipe", "smoke", "--epochs", "1", "--no-progress", "--out", tmp_path / "run"], capsys)
    line = one_line(err)
    assert status == 2 and str(arrays) in line and "damaged" in line and "86,000,000,000 bytes" in line


def test_control_characters_in_a_path_never_reach_the_terminal(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    status, err = run_cli([*TRAIN, "--out", tmp_path / "afile" / "é\x1b[2Jb\u202e"], capsys)
    line = one_line(err)
    assert status == 2 and "\x1b" not in err and "\u202e" not in err
    assert "é\\x1b[2Jb\\u202e" in line


def test_an_infinite_lr_is_refused_by_a_message_that_says_so(tmp_path, capsys):
    status, err = run_cli([*TRAIN, "--lr", "inf", "--out", tmp_path / "run"], capsys)
    assert status == 2 and "lr must be in (0, inf), got inf" in one_line(err)


def test_a_failed_notebooks_one_line_comes_first_and_its_traceback_after(tmp_path, capsys):
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                 "language": "python"}})
    notebook.cells = [nbformat.v4.new_code_cell("profile: str = 'quick'", metadata={"tags": ["parameters"]}),
                      nbformat.v4.new_code_cell("def f():\n    raise ValueError('broken on purpose')\nf()")]
    nbformat.write(notebook, tmp_path / "02_bad.ipynb")

    def build(profile, build_dir):
        book_build.execute_notebook(tmp_path / "02_bad.ipynb", tmp_path / "out.ipynb", {"profile": profile})
    with mock.patch.object(book_build, "run_book_build", build):
        status, err = run_cli(["book", "--profile", "smoke"], capsys)
    ours = [line for line in err.splitlines() if not line.startswith("[IPKernelApp]")]   # the kernel's own
    assert status == 2 and ours[0] == "error: notebook 02_bad.ipynb failed in cell 3: ValueError: broken on purpose"
    assert any("raise ValueError('broken on purpose')" in line for line in ours[1:]) and "\x1b" not in err
    assert not (tmp_path / "out.ipynb").exists()


# ----------------------------------------------------------------------------- property tests in CI

def test_property_tests_draw_the_same_examples_unless_fuzzing():
    """CI's property tests are derandomized (a fixed seed): a failure is a change's, not the
    draw's; ``make fuzz`` runs them with fresh draws (``HYPOTHESIS_PROFILE=fuzz``)."""
    from hypothesis import settings

    fuzzing = os.environ.get("HYPOTHESIS_PROFILE", "ci") == "fuzz"
    assert settings.default.derandomize is not fuzzing
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "HYPOTHESIS_PROFILE=fuzz" in makefile and "-m property" in makefile
