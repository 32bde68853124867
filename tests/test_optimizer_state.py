"""Chapter 07's measure of the loss around an update, and its page's hand-written prose."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from barter_mini.book import optimizer_state
from barter_mini.book.optimizer_state import DEFAULT_POLICIES, check_policies, loss_changes
from barter_mini.errors import BarterError
from barter_mini.training.trainer import UPDATE_WINDOW

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "07_optimizer_state.ipynb"


def test_defaults_are_the_settings_defaults():
    assert DEFAULT_POLICIES == {"barter": "fresh", "rigl": "reset"}
    assert all((method, policy) in optimizer_state.POLICIES for method, policy in DEFAULT_POLICIES.items())


def test_the_loss_change_is_measured_against_the_mean_before_the_update():
    """Delta_k = loss at offset k minus the mean of the steps up to the update (offsets
    1 - W .. 0), per update; an update without a window before it is left out."""
    metrics = {"update_losses": [{"step": 40, "before": [3.0, 2.0, 1.0], "after": [2.5, 0.5]},
                                 {"step": 80, "before": [], "after": [1.0]}]}
    changes = loss_changes(metrics)
    assert list(changes["offset"]) == [-2, -1, 0, 1, 2]
    assert list(changes["change"]) == [1.0, 0.0, -1.0, 0.5, -1.5]
    assert set(changes["update"]) == {40}


def test_policy_labels_are_checked():
    assert check_policies(["rigl/warmup", "barter/split"]) == [("rigl", "warmup"), ("barter", "split")]
    with pytest.raises(BarterError, match="unknown policy 'barter/reset'"):
        check_policies(["barter/reset"])


def test_chapter_07s_prose_types_no_window_length():
    """The Markdown glues the windows' lengths from the code, so it cannot contradict it."""
    text = "\n".join(c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "markdown")
    words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 10: "ten"}
    for n in {UPDATE_WINDOW, optimizer_state.SPIKE_STEPS}:
        for spelled in (f"{n}", words.get(n, f"{n}")):
            assert not re.search(rf"\b{spelled} (optimizer )?(steps|before|after)\b", text, re.IGNORECASE), spelled
    assert "{glue:text}`07-window`" in text and "{glue:text}`07-spike-steps`" in text
