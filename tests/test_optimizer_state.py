"""Chapter 07 ends with a conclusion composed from its own runs."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pandas as pd

from barter_mini.book import optimizer_state
from barter_mini.book.optimizer_state import DEFAULT_POLICIES, figure_legend, reading_the_results, runs_legend
from barter_mini.training.trainer import UPDATE_WINDOW


def _runs(seeds=(0, 1, 2), spike=-0.02, warmup_gain=(0.1, -0.3, 0.2)) -> pd.DataFrame:
    rows = []
    for (method, policy), val_acc in ((("barter", "split"), 61.0), (("barter", "fresh"), 60.0),
                                      (("barter", "warmup"), None), (("rigl", "reset"), 58.0),
                                      (("rigl", "warmup"), 58.5)):
        for i, seed in enumerate(seeds):
            score = 60.0 + warmup_gain[i] if val_acc is None else val_acc + 0.1 * seed
            rows.append({"method": method, "policy": policy, "seed": seed, "val_acc": score, "acc": score,
                         "updates": 4, "spike": spike + (0.001 if policy == "fresh" else 0.0),
                         "head_transfers": 6 if method == "barter" else 0,
                         "ffn_transfers": 50 if method == "barter" else 0})
    return pd.DataFrame(rows)


def test_defaults_are_the_settings_defaults():
    assert DEFAULT_POLICIES == {"barter": "fresh", "rigl": "reset"}


def test_no_cold_start_and_a_policy_above_its_default():
    text = reading_the_results(_runs())
    assert "barter -0.020 (`split`), -0.019 (`fresh`), -0.020 (`warmup`); rigl -0.020 (`reset`)" in text
    assert "(mean over the updates of 3 seeds)" in text
    assert "It fell under every policy: there is no cold start to cure here." in text
    # split: +1.00 on every seed; warmup: 60.1, 59.7, 60.2 minus 60.0, 60.1, 60.2
    assert "barter `split` +1.00 ± 0.00 points against `fresh`" in text
    assert "barter `warmup` -0.10 ± 0.26 points against `fresh`" in text
    assert "rigl `warmup` +0.50 ± 0.00 points against `reset`" in text
    assert "Above its default beyond the seed noise (twice its standard error): barter `split`, rigl `warmup`" in text
    assert "A BARTER update here moved 1.5 heads and 12.5 FFN channels on average" in text
    assert all(line.startswith("* ") for line in text.splitlines())


def test_a_cold_start_and_no_gain_beyond_the_noise():
    runs = _runs(spike=0.01)
    runs = runs[(runs["policy"] != "split") & ~((runs["method"] == "rigl") & (runs["policy"] == "warmup"))]
    text = reading_the_results(runs)
    assert "It rose under `barter/fresh`, `barter/warmup`, `rigl/reset`: a cold start" in text
    assert "No policy is above its method's default beyond the seed noise" in text
    assert "(`fresh` for barter, `reset` for rigl)" in text
    assert "rigl `warmup`" not in text


def test_one_seed_decides_nothing():
    text = reading_the_results(_runs(seeds=(0,)))
    assert "barter `split` +1.00 points against `fresh`" in text       # no std on one seed
    assert "One seed cannot tell a policy's gain from the seed-to-seed noise" in text
    assert "Above its default" not in text and "No policy is above" not in text
    assert "1 seed)" in text


def test_without_the_default_there_is_no_comparison():
    text = reading_the_results(_runs()[lambda r: r["policy"] != "fresh"])
    assert "against `fresh`" not in text and "rigl `warmup` +0.50" in text


def test_the_legends_state_the_windows_the_code_uses(monkeypatch):
    """Chapter 07's legends say how many steps the runs record and the spike averages, from
    the constants, so the page cannot contradict the code when they change."""
    assert optimizer_state.UPDATE_WINDOW == UPDATE_WINDOW
    monkeypatch.setattr(optimizer_state, "UPDATE_WINDOW", 4)
    monkeypatch.setattr(optimizer_state, "SPIKE_STEPS", 1)
    assert "over the one step after an update (relative to the four steps before it;" in runs_legend()
    assert figure_legend().startswith("Training loss minus its mean over the four steps before the update, "
                                      "at each step from -3 to 4 (")
    monkeypatch.setattr(optimizer_state, "UPDATE_WINDOW", 20)
    assert "from -19 to 20" in figure_legend() and "the 20 steps before" in figure_legend()


def test_chapter_07s_prose_types_no_window_length():
    """The Markdown cells leave the windows' lengths to the legends above."""
    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "07_optimizer_state.ipynb"
    text = "\n".join(c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "markdown")
    for n in {UPDATE_WINDOW, optimizer_state.SPIKE_STEPS}:
        for spelled in (f"{n}", optimizer_state._WORDS[n]):
            assert not re.search(rf"\b{spelled} (steps|before|after)\b", text, re.IGNORECASE), spelled


def test_the_introductions_sentence_agrees_with_the_chapters_reading():
    assert optimizer_state.headline(_runs()) == (
        "Over 3 seeds, the loss just after an update was lower than before it under every policy: no cold start to "
        "cure; `barter/split`, `rigl/warmup` each beat their method's default beyond the seed noise.")
    cold = _runs(spike=0.01)[lambda r: r["policy"] != "split"].query("not (method == 'rigl' and policy == 'warmup')")
    assert optimizer_state.headline(cold) == (
        "Over 3 seeds, the loss rose just after an update under `barter/fresh`, `barter/warmup`, `rigl/reset`: a "
        "cold start; no policy beat its method's default beyond the seed noise.")
    assert optimizer_state.headline(_runs(seeds=(0,))).endswith(
        "one seed cannot say whether any policy beats the defaults.")
    assert optimizer_state.headline(_runs(seeds=(0,))).startswith("Over 1 seed, ")
