"""The paper's numbers quoted on the book's Markdown pages come from data/paper/, through
substitutions the build writes into the staged _config.yml."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from barter_mini.book.build import write_substitutions
from barter_mini.book.experiments import read_paper_table
from barter_mini.book.paper_numbers import duration, duration_range, paper_substitutions, run_time
from barter_mini.training.recipes import RECIPES

BOOK = Path(__file__).resolve().parents[1] / "book"


def test_every_substitution_a_page_uses_is_defined():
    used = {key for page in BOOK.glob("*.md") for key in re.findall(r"\{\{\s*(\w+)\s*\}\}", page.read_text())}
    assert used, "the introduction quotes the paper through substitutions"
    assert used <= set(paper_substitutions()), f"undefined: {sorted(used - set(paper_substitutions()))}"


def test_the_quoted_numbers_are_the_papers():
    numbers = paper_substitutions()
    assert numbers["iphone_speedup"] == "2.78" and numbers["iphone_rigl_s"] == "1,699.36"
    assert numbers["table6_dense_s"] == "68.45" and numbers["paper_dense_acc"] == "73.49"
    rows = numbers["paper_accuracy_table"].splitlines()
    assert len(rows) == 2 + 4 and rows[2] == "| 0.1 | 63.16 | 66.13 | 67.01 |"


def test_the_reproduction_chapters_numbers_are_the_papers():
    numbers = paper_substitutions()
    assert {key: numbers[key] for key in (
        "table6_rigl_low_s", "table6_rigl_high_s", "table8_dense_s", "table8_masked_low_s", "table8_masked_high_s",
        "table14_barter_rho01_s", "table14_barter_rho03_s", "table14_static_rho05_s",
        "table14_barter_rho01_gib", "table14_barter_rho03_gib", "table17_update_ms", "table17_update_s",
        "table13_barter_accs", "table13_static_accs", "table13_densities", "table13_std_low",
        "table13_std_high", "cct_epochs", "vit_epochs")} == {
        "table6_rigl_low_s": "68.97", "table6_rigl_high_s": "69.24",                      # Table 6, RigL
        "table8_dense_s": "39.78", "table8_masked_low_s": "42.31", "table8_masked_high_s": "47.32",  # Table 8
        "table14_barter_rho01_s": "11.90", "table14_barter_rho03_s": "25.48", "table14_static_rho05_s": "36.90",
        "table14_barter_rho01_gib": "2.197", "table14_barter_rho03_gib": "4.280",        # Table 14
        "table17_update_ms": "0.019", "table17_update_s": "2",                            # Table 17: 1.989 s
        "table13_barter_accs": "66.13, 71.38, 72.85 and 73.26",                           # Table 13
        "table13_static_accs": "63.16, 70.43, 71.80 and 72.99", "table13_densities": "0.1, 0.3, 0.5, 0.7",
        "table13_std_low": "0.1", "table13_std_high": "0.5",                              # 0.13 and 0.46
        "cct_epochs": "200", "vit_epochs": "100"}                                        # Table 5


def test_a_runs_cost_is_the_papers_time_per_epoch_times_the_recipes_epochs():
    numbers = paper_substitutions()
    epochs = read_paper_table("table06_08_epoch_time_gpu").set_index(["model", "method", "density"])
    segments = read_paper_table("table14_static_vs_barter_gpu").set_index(["method", "density"])
    cct, vit = RECIPES["paper-cct"].epochs, RECIPES["paper-vit"].epochs
    assert numbers["cost_cct_dense"] == run_time(cct * epochs.loc[("cct-paper", "dense", 1.0), "s_per_epoch_mean"])
    assert numbers["cost_cct_dense"] == "13,700 s ≈ 3.8 h" and numbers["cost_cct_dense_h"] == "3.8"
    assert numbers["cost_cct_three_dense_h"] == "11"                       # 3 x 13,690 s
    assert numbers["cost_cct_rigl"] == "3.8 h"                             # 13,794 to 13,848 s
    assert numbers["cost_cct_barter_rho01"] == run_time(cct * segments.loc[("barter", 0.1), "s_per_segment_mean"])
    assert numbers["cost_cct_barter_rho01"] == "2,400 s ≈ 40 min"
    assert numbers["cost_cct_barter_rho03"] == "5,100 s ≈ 1.4 h"
    assert numbers["cost_cct_static_rho05"] == "7,400 s ≈ 2.0 h"            # 7,380 s
    assert numbers["cost_vit_dense"] == run_time(vit * epochs.loc[("vit-paper", "dense", 1.0), "s_per_epoch_mean"])
    assert numbers["cost_vit_dense"] == "4,000 s ≈ 1.1 h" and numbers["cost_vit_masked"] == "1.2–1.3 h"


def test_durations_read_in_minutes_under_an_hour_and_in_hours_above():
    assert duration(2380) == "40 min" and duration(13690) == "3.8 h"
    assert run_time(5096) == "5,100 s ≈ 1.4 h"
    assert duration_range(13794, 13848) == "3.8 h" and duration_range(4231, 4732) == "1.2–1.3 h"
    assert duration_range(1200, 2400) == "20 min–40 min"


def test_the_pages_that_quote_the_paper_type_none_of_its_numbers():
    """A number of a substitution typed on a page as well would be a second place to update."""
    numbers = {n for value in paper_substitutions().values() for n in re.findall(r"\d[\d,]*\.\d{2,}", value)}
    for name in ("intro.md", "reproduce.md"):
        text = re.sub(r"\{\{\s*\w+\s*\}\}", "", (BOOK / name).read_text())
        typed = sorted(n for n in numbers if re.search(rf"(?<![\d.]){re.escape(n)}(?!\d)", text))
        assert not typed, f"{name} types {typed}: quote them through substitutions"


def test_the_build_writes_them_into_the_staged_config(tmp_path):
    config = tmp_path / "_config.yml"
    config.write_text("title: t\nparse:\n  myst_enable_extensions: [substitution]\n")
    write_substitutions(config, {"a": "1"})
    settings = yaml.safe_load(config.read_text())
    assert settings["parse"] == {"myst_enable_extensions": ["substitution"], "myst_substitutions": {"a": "1"}}
