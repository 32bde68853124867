"""A checkpoint is a registry of stateful parts (training.checkpoint_parts): every entry is one
row, written and loaded through its part's ``state_dict`` and ``load_state_dict`` in the rows'
order, the key tuples of each use read off the rows, and a file of an earlier layout refused
in one line."""

from __future__ import annotations

import torch
import pytest

from barter_mini.cli import main
from barter_mini.training.checkpoint_parts import (CHECKPOINT_FORMAT, PARTS, CheckpointManager, Derived, keys_for,
                                                   MODEL_USE, RESUME_USE, RUN_USE)
from barter_mini.training.checkpoints import MODEL_KEYS, RESUME_KEYS, RUN_KEYS, save_checkpoint
from barter_mini.training.progress import PROGRESS_CHECKS, Progress

SMOKE = ["--method", "static", "--dataset", "digits", "--recipe", "smoke", "--epochs", "1", "--density", "0.5",
         "--seed", "0", "--no-progress"]


class Recorded:
    """A part that says what it was given and when."""

    def __init__(self, name: str, loaded: list):
        self.name, self.loaded = name, loaded

    def state_dict(self) -> dict:
        return {"of": self.name}

    def load_state_dict(self, state: dict) -> None:
        self.loaded.append((self.name, state))


def test_a_checkpoint_is_one_entry_per_part_written_and_loaded_in_the_rows_order():
    loaded: list = []
    manager = CheckpointManager(states={part.name: Recorded(part.name, loaded) for part in PARTS})
    checkpoint = manager.state_dict()
    assert checkpoint["format"] == CHECKPOINT_FORMAT
    assert set(checkpoint) == {part.name for part in PARTS} | {"format", "version"}
    manager.load_state_dict(checkpoint)
    assert loaded == [(part.name, {"of": part.name}) for part in PARTS]
    order = [name for name, _ in loaded]
    assert order.index("model") < order.index("optimizer") < order.index("controller") < order.index("progress")
    assert order[-1] == "rng"              # building a model draws from the generators: restored last
    with pytest.raises(ValueError, match="one per part"):
        CheckpointManager(states={part.name: Recorded(part.name, loaded) for part in PARTS[1:]})


def test_derived_entries_are_written_and_load_nothing():
    value = {"epochs": 3}
    derived = Derived(lambda: value)
    assert derived.state_dict() is value
    derived.load_state_dict({"epochs": 5})
    assert value == {"epochs": 3}


def test_each_uses_keys_are_read_off_the_rows():
    assert MODEL_KEYS == keys_for(MODEL_USE) == ("model_config", "allocation", "model")
    assert RUN_KEYS == keys_for(RUN_USE) == MODEL_KEYS + ("run", "controller", "epoch", "val")
    assert RESUME_KEYS == keys_for(RESUME_USE) and set(RESUME_KEYS) == {part.name for part in PARTS}


def test_progress_saves_its_saved_fields_and_the_elapsed_time_only():
    progress = Progress(step=7, epoch=2, history=[{"epoch": 1.0}], gflops_per_image=3.0, diverged={"step": 1})
    progress.unread.append((1.0, 0.5, True, 7))
    state = progress.state_dict()
    assert set(state) == set(PROGRESS_CHECKS) and state["step"] == 7 and state["elapsed_s"] >= 0
    restored = Progress()
    restored.load_state_dict({**state, "elapsed_s": 100.0})
    assert (restored.step, restored.epoch, restored.history) == (7, 2, [{"epoch": 1.0}])
    assert restored.history is not progress.history            # a copy: the two runs never share a record
    assert (restored.gflops_per_image, restored.diverged, restored.unread) == (0.0, None, [])


def test_a_checkpoint_of_the_earlier_layout_is_one_line_at_resume_and_export(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *SMOKE, "--out", str(out)]) == 0
    (out / "metrics.json").unlink()
    for name in ("last.pt", "best.pt"):
        checkpoint = torch.load(out / name, weights_only=True)
        save_checkpoint(out / name, {**checkpoint, "format": 3})
    capsys.readouterr()
    for argv, named in ((["train", *SMOKE, "--resume", "--out", str(out)], "last.pt"),
                        (["export", str(out), "--out", str(tmp_path / "x.pt")], "best.pt")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and str(out / named) in err
        assert f"is not a barter-mini checkpoint of format {CHECKPOINT_FORMAT} (found 3)" in err
    assert not (tmp_path / "x.pt").exists()
