"""Values are checked where they enter: settings, surgery indices, run configurations, --out."""

import subprocess
import sys

import pytest
import torch

from barter_mini.core.barter import BarterSettings, TransferSchedule, clone, prune
from barter_mini.core.budgets import Budget
from barter_mini.core.surgery import regather_units
from barter_mini.core.unit_statistics import UnitStatistics
from barter_mini.errors import BarterError, check_in_range, check_integer
from barter_mini.training.checkpoints import CHECKPOINT_FORMAT, load_checkpoint
from barter_mini.training.trainer import RunConfig

from helpers import TINY_CCT, tiny_model


@pytest.mark.parametrize("change, message", [
    ({"delta_t": 0}, "delta_t must be a positive integer, got 0"),
    ({"delta_t": 2.5}, "delta_t must be a positive integer"),
    ({"t_end": 0.0}, "t_end must be in (0, 1]"),
    ({"t_end": 1.2}, "t_end must be in (0, 1]"),
    ({"head_fraction": -0.1}, "head_fraction must be in [0, 1]"),
    ({"ffn_fraction": 1.5}, "ffn_fraction must be in [0, 1]"),
    ({"split_alpha": 1.5}, "split_alpha must be in (0, 1)"),
    ({"split_alpha": 0.0}, "split_alpha must be in (0, 1)"),
    ({"symmetry_noise": -1e-3}, "symmetry_noise must be in [0, inf)"),
    ({"transfer_multiplier": 0}, "transfer_multiplier must be in (0, inf)"),
    ({"stats_beta": 1.0}, "stats_beta must be in [0, 1)"),
    ({"min_age": -1}, "min_age must be an integer >= 0"),
    ({"clone_moments": "zero"}, "unknown clone_moments 'zero': choose one of fresh, split, warmup, zero-momentum"),
    ({"pruning_score": "fisher"}, "unknown pruning_score 'fisher': choose one of magnitude, taylor-abs, taylor-squared"),
    ({"parent_score": "age"}, "unknown parent_score 'age': choose one of importance, pressure"),
    ({"receiver_rule": "max"}, "unknown receiver_rule 'max': choose one of mean-importance, mean-pressure"),
])
def test_barter_settings_refuse_bad_values(change, message):
    with pytest.raises(BarterError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        BarterSettings(**change).validate()
    with pytest.raises(BarterError):          # the schedule refuses them too: no raw modulo error
        TransferSchedule(100, Budget(8, 40), BarterSettings(**change))


def test_defaults_and_recipes_are_valid():
    assert BarterSettings().validate() == BarterSettings()


def units(kind="ffn"):
    model = tiny_model(TINY_CCT)                    # ffn (5, 8, 3), heads (2, 3, 1)
    return model, UnitStatistics(model)


@pytest.mark.parametrize("victims, message", [
    ([1, 9], r"cannot prune ffn \[9\]: the layer has 5 ffn, indices 0..4"),
    ([-1], r"cannot prune ffn \[-1\]"),
    ([2, 2], r"cannot prune ffn \[2\] twice"),
    ([0, 1, 2, 3, 4], "would empty the layer"),
])
def test_prune_refuses_bad_victims(victims, message):
    model, stats = units()
    before = model.blocks[0].mlp.fc1.weight
    with pytest.raises(BarterError, match=message):
        prune(model.blocks[0], "ffn", victims, stats.layers["ffn"][0], None)
    assert model.blocks[0].mlp.fc1.weight is before            # nothing half-done


@pytest.mark.parametrize("parents, message", [
    ([7], r"cannot clone heads \[7\]: the layer has 3 heads"),
    ([1, 1], r"cannot clone heads \[1\] twice"),
])
def test_clone_refuses_bad_parents(parents, message):
    model, stats = units()
    with pytest.raises(BarterError, match=message):
        clone(model.blocks[1], "heads", parents, stats.layers["heads"][1], None)
    assert model.blocks[1].attn.num_heads == 3


def test_regather_refuses_out_of_range_sources_and_empty_layers():
    model, _ = units()
    with pytest.raises(BarterError, match=r"from units \[5\]"):
        regather_units(model.blocks[0], "ffn", torch.tensor([0, 5]), torch.ones(2))
    with pytest.raises(BarterError, match="to no units"):
        regather_units(model.blocks[0], "ffn", torch.tensor([], dtype=torch.long), torch.ones(0))
    with pytest.raises(BarterError, match="one per new unit"):
        regather_units(model.blocks[0], "ffn", torch.tensor([0, 1]), torch.ones(3))
    assert model.blocks[0].mlp.fc1.out_features == 5


def test_the_shared_checks():
    assert check_integer("n", 3) == 3
    assert check_integer("workers", 0, minimum=0) == 0
    for bad in (0, -2, True, 1.5, "3"):
        with pytest.raises(BarterError, match="n must be a positive integer"):
            check_integer("n", bad)
    assert check_in_range("x", 0.5, 0, 1, low_open=True, high_open=True) == 0.5
    for bad in (0, 1, float("nan"), "0.5", None):
        with pytest.raises(BarterError, match=r"x must be in \(0, 1\)"):
            check_in_range("x", bad, 0, 1, low_open=True, high_open=True)


def test_run_config_validate_returns_a_normalised_copy():
    run = RunConfig(method="dense", density=0.3)
    checked = run.validate()
    assert checked.density == 1.0 and run.density == 0.3
    assert RunConfig(method="barter", density=0.3).validate().density == 0.3
    with pytest.raises(BarterError, match="epochs must be a positive integer"):
        RunConfig(epochs=0).validate()
    assert RunConfig(method="static", start="first").validate().start == "first"
    with pytest.raises(BarterError, match="start 'last' needs a compact method: rigl trains full-width"):
        RunConfig(method="rigl", start="last").validate()
    with pytest.raises(BarterError, match="unknown start 'middle'"):
        RunConfig(start="middle").validate()


@pytest.mark.parametrize("out", ["/dev/null/run", "/proc/version/run"])
def test_train_out_that_cannot_be_created_is_a_one_line_error(out):
    result = subprocess.run([sys.executable, "-m", "barter_mini.cli", "train", "--dataset", "digits",
                             "--recipe", "smoke", "--out", out], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("error: cannot create the folder") and result.stderr.count("\n") == 1


def test_truncated_or_foreign_checkpoints_are_one_line_errors(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "model_config": {}, "allocation": {}, "model": {}}, good)
    assert load_checkpoint(good)["format"] == CHECKPOINT_FORMAT
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:40])
    with pytest.raises(BarterError, match="not a readable checkpoint"):
        load_checkpoint(truncated)
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(BarterError, match=f"not a barter-mini checkpoint of format {CHECKPOINT_FORMAT}"):
        load_checkpoint(foreign)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "best.pt").write_bytes(b"\x00" * 10)
    result = subprocess.run([sys.executable, "-m", "barter_mini.cli", "export", str(tmp_path / "run"),
                             "--out", str(tmp_path / "x.pt")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "not a readable checkpoint" in result.stderr
    assert not (tmp_path / "x.pt").exists()


def test_a_flag_wins_over_the_same_setting_in_the_method_settings():
    from barter_mini.training.optimization import resolve_recipe
    both = RunConfig(transfer_multiplier=2.0).with_method_settings(transfer_multiplier=12.0, clone_moments="fresh")
    recipe = resolve_recipe(both, "cct")
    assert recipe.barter.transfer_multiplier == 2.0 and recipe.barter.clone_moments == "fresh"
    changed = RunConfig().with_method_settings(transfer_multiplier=12.0)
    assert resolve_recipe(changed, "cct").barter.transfer_multiplier == 12.0
    assert resolve_recipe(changed, "cct").barter.delta_t == 40                      # the rest is the quick recipe's


def test_method_settings_are_typed_by_the_methods_registry_row():
    from barter_mini.core.barter import BarterSettings
    from barter_mini.masked import MaskedSettings
    from barter_mini.training.optimization import resolve_recipe
    rigl = RunConfig(method="rigl").with_method_settings(regrow_moments="warmup")
    assert isinstance(rigl.method_settings, MaskedSettings)
    assert resolve_recipe(rigl, "cct").masked.regrow_moments == "warmup"
    with pytest.raises(BarterError, match=r"^MaskedSettings has no setting clone_moments: it has "):
        RunConfig(method="rigl").with_method_settings(clone_moments="split")
    with pytest.raises(BarterError, match=r"^static has no settings to change$"):
        RunConfig(method="static").with_method_settings(delta_t=3)
    with pytest.raises(BarterError, match=r"^method_settings of rigl must be MaskedSettings, got BarterSettings$"):
        RunConfig(method="rigl", method_settings=BarterSettings()).validate()
    with pytest.raises(BarterError, match="clone_moments"):
        RunConfig().with_method_settings(clone_moments="cold").validate()
    # a run's JSON record reads back typed
    from dataclasses import asdict
    barter = RunConfig().with_method_settings(scope="within-layer")
    assert RunConfig(**asdict(barter)) == barter
    with pytest.raises(BarterError, match="do not fit BarterSettings"):
        RunConfig(method_settings={"no_such_setting": 1})


def test_a_given_allocation_must_hold_the_budgets(tmp_path):
    from barter_mini.core.models import get_model_config
    from barter_mini.training.run_inputs import start_allocation
    config = get_model_config("cct-mini")
    run = RunConfig(method="static", density=0.3, allocation={"heads": [6, 2, 2, 2], "ffn": [10, 20, 30, 94]})
    assert start_allocation(run.validate(), config).ffn == (10, 20, 30, 94)
    with pytest.raises(BarterError, match="the given allocation holds 12 heads and 155 FFN channels; density 0.3"):
        start_allocation(RunConfig(method="static", allocation={"heads": [6, 2, 2, 2], "ffn": [11, 20, 30, 94]}),
                         config)
    with pytest.raises(BarterError, match="ffn allocation .* is invalid for cct-mini"):
        start_allocation(RunConfig(method="static", allocation={"heads": [6, 2, 2, 2], "ffn": [0, 30, 30, 94]}),
                         config)
    with pytest.raises(BarterError, match="give either start 'first' or an allocation, not both"):
        RunConfig(method="static", start="first", allocation={"heads": [3] * 4, "ffn": [39, 39, 38, 38]}).validate()
    with pytest.raises(BarterError, match="a given allocation needs a compact method"):
        RunConfig(method="set", allocation={"heads": [3] * 4, "ffn": [39, 39, 38, 38]}).validate()
