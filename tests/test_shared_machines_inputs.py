"""Inputs of a shared machine that must never cost a run or print a traceback: model options
that would load a file, damaged JSON of any depth, settings read from a file, a full disk,
paths the system refuses, array headers that lie, and control characters in paths.

Every refusal on the command line is exit status 2 and one ``error: ...`` line (argparse's
refusal of a flag: its usage, then one error line), before any work where the input is
given on the command line.
"""

import json
import os
from pathlib import Path

import pytest
import timm
import torch

from barter_mini.core.models import get_model_config, timm_vit
from barter_mini.errors import BarterError
from barter_mini.training import cache
from barter_mini.training.checkpoints import read_json

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


# ----------------------------------------------------------------------------- property tests in CI

def test_property_tests_draw_the_same_examples_unless_fuzzing():
    """CI's property tests are derandomized (a fixed seed): a failure is a change's, not the
    draw's; ``make fuzz`` runs them with fresh draws (``HYPOTHESIS_PROFILE=fuzz``)."""
    from hypothesis import settings

    fuzzing = os.environ.get("HYPOTHESIS_PROFILE", "ci") == "fuzz"
    assert settings.default.derandomize is not fuzzing
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "HYPOTHESIS_PROFILE=fuzz" in makefile and "-m property" in makefile
