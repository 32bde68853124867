"""The paper's numbers quoted on the book's Markdown pages come from data/paper/, through
substitutions the build writes into the staged _config.yml."""

from __future__ import annotations

import pytest
import re
from pathlib import Path

import yaml

from barter_mini.book.build import stage_sources, write_substitutions
from barter_mini.book.experiments import read_paper_table
from barter_mini.book.paper_numbers import (
    duration,
    duration_range,
    book_substitutions,
    model_substitutions,
    paper_substitutions,
    run_time,
    schedule_substitutions,
)
from barter_mini.core.barter import BarterSettings, TransferSchedule
from barter_mini.core.budgets import compute_budget
from barter_mini.core.counting import count_parameters, training_gflops_per_image
from barter_mini.core.models import build_model, get_model_config
from barter_mini.training.recipes import RECIPES

REPO = Path(__file__).resolve().parents[1]
BOOK = REPO / "book"
#: the pages that quote the paper through substitutions, and so must type none of its numbers
QUOTING_PAGES = ("intro.md", "method.md", "reproduce.md")
SUBSTITUTION = r"\{\{\s*(\w+)\s*\}\}"


def test_every_substitution_a_page_uses_is_defined():
    used = {key for page in BOOK.glob("*.md") for key in re.findall(SUBSTITUTION, page.read_text())}
    assert used, "the introduction quotes the paper through substitutions"
    assert used <= set(book_substitutions()), f"undefined: {sorted(used - set(book_substitutions()))}"


def test_the_staged_config_defines_every_substitution_a_staged_page_uses(tmp_path):
    """What the build stages (stage_sources: write_substitutions into the staged _config.yml)
    defines every {{ key }} of every page under book/; an undefined one would render as nothing."""
    stage = tmp_path / "stage"
    stage_sources(stage, REPO)
    defined = yaml.safe_load((stage / "_config.yml").read_text())["parse"]["myst_substitutions"]
    pages = sorted((stage / "book").glob("*.md"))
    assert {page.name for page in pages} >= set(QUOTING_PAGES)
    for page in pages:
        used = set(re.findall(SUBSTITUTION, page.read_text()))
        assert used <= set(defined), f"{page.name} uses undefined substitutions {sorted(used - set(defined))}"
        assert all(isinstance(defined[key], str) and defined[key] for key in used), page.name
    assert all(set(re.findall(SUBSTITUTION, page.read_text())) for page in pages if page.name in QUOTING_PAGES)


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
    for name in QUOTING_PAGES:
        text = re.sub(r"\{\{\s*\w+\s*\}\}", "", (BOOK / name).read_text())
        typed = sorted(n for n in numbers if re.search(rf"(?<![\d.]){re.escape(n)}(?!\d)", text))
        assert not typed, f"{name} types {typed}: quote them through substitutions"


def test_the_build_writes_them_into_the_staged_config(tmp_path):
    config = tmp_path / "_config.yml"
    config.write_text("title: t\nparse:\n  myst_enable_extensions: [substitution]\n")
    write_substitutions(config, {"a": "1"})
    settings = yaml.safe_load(config.read_text())
    assert settings["parse"] == {"myst_enable_extensions": ["substitution"], "myst_substitutions": {"a": "1"}}


def test_the_method_chapters_paper_numbers_are_the_papers():
    numbers = paper_substitutions()
    assert {key: numbers[key] for key in (
        "table12_density", "table12_barter_acc", "table12_random_receiver_acc", "table12_random_donor_acc",
        "table12_random_pair_acc", "table12_static_acc", "table15_rho01_gflops", "table15_rho01_params_m",
        "table15_rho05_gflops", "table15_rho05_params_m", "table3_cct_rho01_heads_listed",
        "table3_cct_rho01_ffn_listed", "table3_vit_rho03_heads", "table3_cct_rho07_heads", "table3_cct_rho07_ffn",
        "table3_cct_rho07_k_heads", "table3_cct_rho07_k_ffn")} == {
        "table12_density": "0.5", "table12_barter_acc": "72.85", "table12_random_receiver_acc": "72.49",  # Table 12
        "table12_random_donor_acc": "71.54", "table12_random_pair_acc": "71.20", "table12_static_acc": "71.80",
        "table15_rho01_gflops": "0.750", "table15_rho01_params_m": "0.4802",                            # Table 15
        "table15_rho05_gflops": "3.569", "table15_rho05_params_m": "1.9480",
        "table3_cct_rho01_heads_listed": "11 (1–2)", "table3_cct_rho01_ffn_listed": "371 (53)",          # Table 3
        "table3_vit_rho03_heads": "33", "table3_cct_rho07_heads": "78", "table3_cct_rho07_ffn": "2,524",
        "table3_cct_rho07_k_heads": "5", "table3_cct_rho07_k_ffn": "142"}
    ablations = read_paper_table("table12_ablations_cct_cifar100").set_index("method")["acc_mean"]
    for method, acc in ablations.items():
        assert numbers[f"table12_{method.replace('-', '_')}_acc"] == f"{acc:.2f}"
    compute = read_paper_table("table15_compute_and_size_cct").set_index(["method", "density"])
    assert float(numbers["table15_rho05_gflops"]) == compute.loc[("barter", 0.5), "train_gflops_per_image"]
    assert float(numbers["table15_rho01_params_m"]) == compute.loc[("barter", 0.1), "params_m"]


def test_the_method_chapters_tables_set_table_3_beside_barter_minis_budgets():
    numbers = paper_substitutions()
    table3 = read_paper_table("table03_budgets")
    budgets, counts = numbers["budget_table"].splitlines(), numbers["transfer_count_table"].splitlines()
    assert len(budgets) == len(counts) == 2 + len(table3)
    assert budgets[2] == "| `cct-paper` | 0.1 | 11, 371 | 11, 368 | 358 |"
    assert budgets[-1] == "| `vit-paper` | 0.3 | 33, 1,033 | 32, 1,052 | 1,037 |"
    assert counts[3] == "| `cct-paper` | 0.3 | 2, 60 | 2, 59 |" and counts[-1] == "| `vit-paper` | 0.3 | 2, 58 | 2, 59 |"
    assert numbers["budget_ffn_gap_max"] == "21"                            # ViT at 0.1: 338 against 359
    assert numbers["transfer_ffn_counts_changed"] == "3"
    assert numbers["vit_rho03_rho_l_h"] == r"$0.3 \cdot 9 \cdot 12 = 32.4$" and numbers["vit_rho03_heads"] == "32"
    assert numbers["cct_rho07_rho_l_h"] == "78.4"


def test_the_method_chapters_claims_about_table_3_hold():
    """The prose around the tables: the head rule reproduces every head count of Table 3 but
    ViT's at 0.3, and the two fractions applied to Table 3's own budgets give its K_H and K_C."""
    settings = BarterSettings()
    missed = []
    for row in read_paper_table("table03_budgets").itertuples(index=False):
        if compute_budget(get_model_config(row.model), row.density).heads != row.heads:
            missed.append((row.model, row.density))
        assert (round(settings.head_fraction * row.heads), round(settings.ffn_fraction * row.ffn)) == (
            row.k_heads, row.k_ffn), (row.model, row.density)
    assert missed == [("vit-paper", 0.3)]


def test_this_rules_compact_cct_is_within_half_a_percent_of_table_15():
    config = get_model_config("cct-paper")
    for row in read_paper_table("table15_compute_and_size_cct").itertuples(index=False):
        model = build_model(config, row.density)
        assert abs(training_gflops_per_image(model) / row.train_gflops_per_image - 1) < 0.005, row
        assert abs(count_parameters(model) / 1e6 / row.params_m - 1) < 0.005, row


def test_the_introductions_numbers_are_the_papers_and_the_codes():
    numbers = paper_substitutions()
    assert {key: numbers[key] for key in (
        "table7_masked_gflops", "table6_density_low", "table6_density_high", "iphone_density",
        "rigl_ahead_densities")} == {
        "table7_masked_gflops": "7.09", "table6_density_low": "0.1", "table6_density_high": "0.7",  # Tables 7, 6
        "iphone_density": "0.3", "rigl_ahead_densities": "0.1, 0.3 and 0.7"}                        # Tables 2, 1, 13
    assert float(numbers["table7_masked_gflops"]) == pytest.approx(read_paper_table("table07_compute_masked_cct")[
        "train_gflops_per_image"].iloc[0], abs=0.005)
    assert model_substitutions() == {
        "cct_layers": "7", "cct_dense_params": "3,783,269", "cct_dense_gflops": "7.09",
        "cct_rho01_params": "478,677", "cct_rho01_gflops": "0.748", "cct_rho01_heads": "11", "cct_rho01_ffn": "368"}
    # the masks' estimated compute (Table 7) is the dense model's, which the code counts alike
    assert numbers["cct_dense_gflops"] == numbers["table7_masked_gflops"]


def test_the_gap_static_to_barter_is_largest_at_the_lowest_density():
    """The introduction says so beside Table 13."""
    table = read_paper_table("table13_static_vs_barter_cct_cifar100").pivot(
        index="density", columns="method", values="acc_mean")
    gap = table["barter"] - table["static"]
    assert gap.idxmax() == gap.index.min()


def test_the_method_chapters_schedule_is_the_codes():
    numbers = schedule_substitutions()
    assert numbers == {
        "cct_steps_per_epoch": "351", "schedule_total_steps": "70,200", "schedule_end_step": "52,650",
        "schedule_updates": "526", "schedule_moving_updates": "103", "schedule_ffn_updates": "101",
        "schedule_head_updates": "3", "schedule_head_steps": "4,500, 14,000 and 27,200",
        "schedule_ffn_first_quarter": "48", "schedule_ffn_last_quarter": "3"}
    assert int(numbers["schedule_total_steps"].replace(",", "")) == (
        RECIPES["paper-cct"].epochs * int(numbers["cct_steps_per_epoch"]))
    # "... move one FFN channel each and ... move one head"
    schedule = TransferSchedule(70_200, compute_budget(get_model_config("cct-paper"), 0.5))
    assert max(max(schedule.transfers_at(step).values()) for step in schedule.update_steps) == 1
