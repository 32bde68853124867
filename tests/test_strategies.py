"""The named variants are strategies looked up once: by name or as objects they do the same."""

import numpy as np
import pytest
import torch

from barter_mini.core.barter import BarterSettings, clone, select_parents, select_receiver
from barter_mini.core.barter_controller import BarterController
from barter_mini.core.models import build_model
from barter_mini.core.strategies import (CLONE_MOMENTS, PARENT_SCORES, PRUNING_SCORES, RECEIVER_RULES,
                                         by_growth_score, by_pruning_score, resolve)
from barter_mini.core.unit_statistics import UnitStatistics
from barter_mini.errors import BarterError
from barter_mini.training.step import training_step

from helpers import TINY_CCT, batch, tiny_model, train_step


def test_settings_name_the_strategies_of_the_registries():
    settings = BarterSettings(receiver_rule="mean-pressure", parent_score="importance", clone_moments="warmup",
                              scope="within-layer")
    strategies = settings.strategies()
    assert strategies.receiver_rule is RECEIVER_RULES["mean-pressure"] is by_growth_score
    assert strategies.parent_score is PARENT_SCORES["importance"] is by_pruning_score
    assert strategies.clone_moments is CLONE_MOMENTS["warmup"] and strategies.clone_moments.ramps_in
    assert not any(CLONE_MOMENTS[name].ramps_in for name in ("split", "fresh", "zero-momentum"))
    with pytest.raises(BarterError, match="^unknown parent_score 'age': choose one of importance, pressure$"):
        BarterSettings(parent_score="age").strategies()


def test_resolve_takes_a_name_or_the_strategy_itself():
    score = PRUNING_SCORES["taylor-abs"]
    assert resolve("pruning_score", "taylor-abs", PRUNING_SCORES) is score
    assert resolve("pruning_score", score, PRUNING_SCORES) is score
    with pytest.raises(BarterError, match="^unknown pruning_score 'fisher': choose one of magnitude, taylor-abs, "
                                          "taylor-squared$"):
        resolve("pruning_score", "fisher", PRUNING_SCORES)


def test_a_strategy_and_its_name_choose_alike(tiny_config):
    model = tiny_model(tiny_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    by_name = UnitStatistics(model, pruning_score="taylor-squared")
    train_step(model, optimizer, *batch(tiny_config))
    other = tiny_model(tiny_config)
    by_object = UnitStatistics(other, pruning_score=PRUNING_SCORES["taylor-squared"])
    train_step(other, torch.optim.AdamW(other.parameters(), lr=1e-3), *batch(tiny_config))
    assert by_name.pruning_score is by_object.pruning_score is PRUNING_SCORES["taylor-squared"]
    assert all(torch.equal(a, b) for a, b in zip(by_name.tensors(), by_object.tensors()))
    stats, counts = by_name.layers["ffn"], model.allocation().ffn
    for name, rule in RECEIVER_RULES.items():
        assert select_receiver(stats, counts, 12, rule=name) == select_receiver(stats, counts, 12, rule=rule)
        assert stats[0].growth_priority(name) == stats[0].growth_priority(rule)
    for name, score in PARENT_SCORES.items():
        assert select_parents(stats[1], 3, name) == select_parents(stats[1], 3, score)


def test_clone_refuses_an_unknown_policy_before_it_changes_the_layer(tiny_config):
    model = tiny_model(tiny_config)
    stats = UnitStatistics(model)
    before = model.blocks[0].mlp.fc1.weight.detach().clone()
    with pytest.raises(BarterError, match="^unknown clone_moments 'cold': choose one of fresh, split, warmup, "
                                          "zero-momentum$"):
        clone(model.blocks[0], "ffn", [0], stats.layers["ffn"][0], None, clone_moments="cold")
    assert torch.equal(model.blocks[0].mlp.fc1.weight, before)


def test_the_controller_looks_the_names_up_once(monkeypatch):
    """Every update runs on the strategies the controller resolved when it was built."""
    torch.manual_seed(0)
    model = build_model(TINY_CCT, 0.5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    settings = BarterSettings(delta_t=2, transfer_multiplier=20.0, min_age=1, receiver_rule="mean-pressure")
    controller = BarterController(model, optimizer, total_steps=12, settings=settings)

    def looked_up_again(self):
        raise AssertionError("a name was looked up after the controller was built")
    monkeypatch.setattr(BarterSettings, "strategies", looked_up_again)
    x, y = batch(TINY_CCT)
    for step in range(1, 13):
        training_step(model, optimizer, x, y, controller=controller, step=step)
    assert sum(controller.executed.values()) > 0
    assert controller.strategies.receiver_rule is by_growth_score


def test_the_pruning_scores_per_layer_formula_is_the_folds(tiny_config):
    """``PruningScore.of_units`` on one layer's output weights gives one step's score, as the
    statistics' fold does for all layers at once (one step from zero EMAs, bias-corrected)."""
    for name, score in PRUNING_SCORES.items():
        model = tiny_model(tiny_config)
        stats = UnitStatistics(model, pruning_score=name)
        x, y = batch(tiny_config)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        fc2 = model.blocks[1].mlp.fc2.weight
        expected = score.of_units(fc2, 1, 1, 1)
        torch.testing.assert_close(stats.layers["ffn"][1].pruning_scores(), expected, rtol=1e-5, atol=0)
        assert np.isfinite(expected.numpy()).all()
