import json
import subprocess
import sys

import pytest

from barter_mini.core.budgets import PAPER_TABLE3, compute_budget, initial_allocation, spread_evenly
from barter_mini.core.models import get_model_config
from barter_mini.errors import BarterError


@pytest.mark.parametrize("key", sorted(PAPER_TABLE3))
def test_budgets_beside_table_3(key):
    name, density = key
    heads, ffn, _, _ = PAPER_TABLE3[key]
    budget = compute_budget(get_model_config(name), density)
    assert abs(budget.heads - heads) <= 1          # equal except ViT at 0.3 (32 vs 33)
    assert abs(budget.ffn / ffn - 1) < 0.06         # compute-matched rule, documented in budgets.py
    if name == "cct-paper":
        assert budget.heads == heads and abs(budget.ffn / ffn - 1) < 0.011


def test_even_spread_like_table_3():
    # Table 3: CCT rho=0.1 -> 11 heads as 1-2 per layer
    assert spread_evenly(11, 7) == (2, 2, 2, 2, 1, 1, 1)
    allocation = initial_allocation(get_model_config("cct-paper"), compute_budget(get_model_config("cct-paper"), 0.5))
    assert allocation.heads == (8,) * 7


@pytest.mark.parametrize("density", [0.0, -0.2, 1.01, 5])
def test_density_out_of_range_fails_in_one_line(density):
    with pytest.raises(BarterError) as info:
        compute_budget(get_model_config("cct-mini"), density)
    assert "(0, 1]" in str(info.value) and "\n" not in str(info.value)


def test_budget_below_one_unit_per_layer_fails():
    with pytest.raises(BarterError, match="at least one head"):
        compute_budget(get_model_config("cct-paper"), 0.05)


def test_unknown_model_fails_with_the_allowed_names():
    with pytest.raises(BarterError, match="cct-mini, cct-mini-deep, cct-mini-deep-16h, cct-paper, vit-mini, vit-paper"):
        get_model_config("resnet")


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "barter_mini.cli", *args], capture_output=True, text=True)


def test_describe_json_has_params_and_gflops():
    result = run_cli("describe", "--model", "cct-paper", "--density", "0.5", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["params"] == 1946469
    assert abs(data["train_gflops_per_image"] - 3.569) < 0.01
    assert data["budget"] == {"heads": 56, "ffn": 1792}
    assert data["paper_table3"]["ffn"] == 1795
    assert sum(data["allocation"]["heads"]) == 56


def test_describe_text_lists_every_layer():
    result = run_cli("describe", "--model", "vit-paper", "--density", "0.1")
    assert result.returncode == 0
    assert result.stdout.count("\n") >= 9 + 5 and "GFLOPs/image" in result.stdout


@pytest.mark.parametrize("args, expected", [
    (("describe", "--model", "nope"), "unknown model 'nope'"),
    (("describe", "--model", "cct-mini", "--density", "1.5"), "density must be in (0, 1]"),
    (("describe", "--model", "cct-paper", "--density", "0.01"), "at least one head"),
])
def test_cli_bad_input_is_one_line_error(args, expected):
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and expected in result.stderr


@pytest.mark.parametrize("name,density", [("cct-mini", 0.3), ("cct-paper", 0.1), ("vit-paper", 0.7), ("cct-mini", 0.95)])
def test_piled_starts_keep_the_budgets_and_bounds(name, density):
    from barter_mini.core.budgets import STARTS, check_allocation, starting_allocation
    config = get_model_config(name)
    budget = compute_budget(config, density)
    for start in STARTS:
        allocation = check_allocation(config, starting_allocation(config, budget, start))
        assert (sum(allocation.heads), sum(allocation.ffn)) == (budget.heads, budget.ffn)
    first, last = starting_allocation(config, budget, "first"), starting_allocation(config, budget, "last")
    assert first.ffn == tuple(reversed(last.ffn)) and first.heads == tuple(reversed(last.heads))
    assert list(first.ffn) == sorted(first.ffn, reverse=True)
    if density < 0.5:
        assert first.ffn[0] > 2 * first.ffn[-1]          # piled, not even


def test_piled_start_on_cct_mini():
    from barter_mini.core.budgets import starting_allocation
    config = get_model_config("cct-mini")
    assert starting_allocation(config, compute_budget(config, 0.3), "first").ffn == (82, 41, 21, 10)


def test_unknown_start_fails_in_one_line():
    from barter_mini.core.budgets import starting_allocation
    config = get_model_config("cct-mini")
    with pytest.raises(BarterError, match="unknown start .middle.: choose one of even, first, last"):
        starting_allocation(config, compute_budget(config, 0.3), "middle")
