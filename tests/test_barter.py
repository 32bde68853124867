"""Selection rules, the transfer schedule and 1,000 random updates."""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from barter_mini.core.barter import (BarterSettings, TransferSchedule, select_donors, select_parents,
                                select_receiver, topology_update)
from barter_mini.core.budgets import PAPER_TABLE3, Budget
from barter_mini.core.unit_statistics import LayerStatistics, UnitStatistics

from helpers import TINY_CCT, assert_in_sync, batch, tiny_model, train_step


def layer(importance, pressure=None, age=None, beta=0.5):
    n = len(importance)
    stats = LayerStatistics.fresh(n, beta)
    age = torch.tensor(age if age is not None else [1] * n)
    # store EMAs so that the bias-corrected scores equal the given numbers
    correction = 1 - beta ** age.float()
    stats.pruning_ema = torch.tensor(importance, dtype=torch.float) * correction
    stats.growth_ema = torch.tensor(pressure if pressure is not None else importance, dtype=torch.float) * correction
    stats.age = age
    return stats


def test_receiver_is_the_eligible_layer_with_the_highest_mean_importance():
    stats = [layer([1.0, 1.0]), layer([5.0]), layer([9.0, 9.0, 9.0]), layer([2.0, 6.0])]
    # layer 2 has the highest priority but is full (3 of 3); layer 1 (5.0) beats layer 3 (4.0)
    assert select_receiver(stats, [2, 1, 3, 2], full_width=3) == 1
    assert stats[3].growth_priority() == pytest.approx(4.0)


def test_mean_pressure_receiver_follows_the_growth_scores():
    stats = [layer([9.0, 9.0], pressure=[1.0, 1.0]), layer([1.0], pressure=[5.0])]
    assert select_receiver(stats, [2, 1], full_width=3) == 0
    assert select_receiver(stats, [2, 1], full_width=3, rule="mean-pressure") == 1


def test_receiver_needs_a_unit_with_statistics():
    stats = [layer([1.0]), layer([50.0], age=[0])]
    assert select_receiver(stats, [1, 1], full_width=4) == 0
    assert select_receiver([layer([1.0], age=[0])], [1], full_width=4) is None


def test_donors_are_the_lowest_scores_outside_the_receiver():
    stats = [layer([0.5, 3.0, 0.1]), layer([0.05, 0.2]), layer([0.01, 7.0])]
    donors = select_donors(stats, [3, 2, 2], receiver=2, k=3, min_age=1)
    assert donors == [(1, 0), (0, 2), (0, 0)]


def test_donors_leave_every_layer_one_unit_and_spare_young_units():
    stats = [layer([0.1, 0.2]), layer([0.01], age=[5]), layer([0.3, 0.4, 0.05], age=[9, 9, 2])]
    donors = select_donors(stats, [2, 1, 3], receiver=0, k=5, min_age=3)
    # layer 1 keeps its single unit although it scores lowest; unit 2 of layer 2 is too
    # young, so layer 2 gives its two old units and keeps the young one
    assert donors == [(2, 0), (2, 1)]
    assert select_donors(stats, [2, 1, 3], receiver=0, k=5, min_age=1) == [(2, 2), (2, 0)]


def test_donors_cost_one_read_from_the_device_per_layer(monkeypatch):
    """A layer's scores and ages are read to the host together, once, not one float per
    candidate (on a GPU every read waits for the device)."""
    reads = []
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self, _original=torch.Tensor.tolist: (
        reads.append(tuple(self.shape)), _original(self))[1])
    monkeypatch.setattr(torch.Tensor, "__float__", lambda self: pytest.fail("a read of one float"))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("a read of one value"))
    stats = [layer([0.5, 3.0, 0.1]), layer([0.05, 0.2]), layer([0.01, 7.0])]
    assert select_donors(stats, [3, 2, 2], receiver=2, k=3, min_age=1) == [(1, 0), (0, 2), (0, 0)]
    assert reads == [(2, 3), (2, 2)]


def test_parents_are_the_highest_growth_scores():
    stats = layer([1, 1, 1, 1], pressure=[0.2, 9.0, 0.1, 4.0], age=[3, 3, 0, 3])
    assert select_parents(stats, 2) == [1, 3]
    by_importance = layer([5.0, 1.0, 9.0, 7.0], pressure=[0.2, 9.0, 0.1, 4.0], age=[3, 3, 0, 3])
    assert select_parents(by_importance, 2, "importance") == [3, 0]     # unit 2 has no statistics


def test_random_variants_use_the_generator():
    stats = [layer([1.0]), layer([5.0]), layer([2.0])]
    picks = {select_receiver(stats, [1, 1, 1], 4, np.random.default_rng(s)) for s in range(20)}
    assert picks == {0, 1, 2}


@pytest.mark.parametrize("key", sorted(PAPER_TABLE3))
def test_planned_transfers_reproduce_table_3(key):
    heads, ffn, k_h, k_c = PAPER_TABLE3[key]
    schedule = TransferSchedule(total_steps=70200, budget=Budget(heads, ffn))
    assert schedule.planned_totals() == {"heads": k_h, "ffn": k_c}


def test_schedule_is_cosine_decayed_and_adds_up():
    schedule = TransferSchedule(10_000, Budget(56, 1795), BarterSettings(delta_t=100, t_end=0.75,
                                                                      transfer_multiplier=4))
    steps = schedule.update_steps
    assert steps[0] == 100 and steps[-1] == 7500 and len(steps) == 75
    ks = [schedule.transfers_at(s)["ffn"] for s in steps]
    assert sum(ks) == 4 * 101 and sum(schedule.transfers_at(s)["heads"] for s in steps) == 4 * 3
    assert sum(ks[:25]) > sum(ks[25:50]) > sum(ks[50:])        # decays
    # cumulative share at 1/3 of T_end: (t + T/pi sin(pi t/T)) / T with t = T/3
    third = steps[24]
    expected = (1 / 3 + math.sin(math.pi / 3) / math.pi)
    assert sum(ks[:25]) == round(404 * expected)
    assert schedule.transfers_at(150)["ffn"] == 0 and schedule.transfers_at(7600)["ffn"] == 0
    assert third == 2500


# ------------------------------------------------------------------ 1,000 random updates

update = st.fixed_dictionaries({
    "k_heads": st.integers(0, 5), "k_ffn": st.integers(0, 10),
    "min_age": st.integers(1, 4), "seed": st.integers(0, 2**16),
    "random_receiver": st.booleans(), "random_donor": st.booleans(),
    "clone_moments": st.sampled_from(["split", "fresh", "zero-momentum"]),
    "receiver_rule": st.sampled_from(["mean-importance", "mean-pressure"]),
    "parent_score": st.sampled_from(["pressure", "importance"]),
})


def randomize_statistics(statistics, seed):
    """Random scores and ages (0-5 steps) for every unit; returns the generator it drew them from."""
    g = torch.Generator().manual_seed(seed)
    for layer_stats in (*statistics.layers["heads"], *statistics.layers["ffn"]):
        n = layer_stats.age.numel()
        layer_stats.pruning_ema = torch.rand(n, generator=g)
        layer_stats.growth_ema = torch.rand(n, generator=g)
        layer_stats.age = torch.randint(0, 6, (n,), generator=g)
    return g


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(update, min_size=50, max_size=50))
def test_budgets_and_bounds_hold_after_random_updates(updates):
    """20 examples x 50 updates = 1,000 random updates with random statistics."""
    model = tiny_model(TINY_CCT, heads=(2, 3, 1), ffn=(5, 8, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    statistics = UnitStatistics(model)
    train_step(model, optimizer, *batch(TINY_CCT))
    budget = (6, 16)
    for u in updates:
        g = randomize_statistics(statistics, u["seed"])
        young = {kind: [(l, u_) for l, s in enumerate(statistics.layers[kind])
                        for u_ in range(s.age.numel()) if s.age[u_] < u["min_age"]]
                 for kind in ("heads", "ffn")}
        settings_ = BarterSettings(min_age=u["min_age"], random_receiver=u["random_receiver"],
                                   random_donor=u["random_donor"], clone_moments=u["clone_moments"],
                                   receiver_rule=u["receiver_rule"], parent_score=u["parent_score"])
        records = topology_update(model, {"heads": u["k_heads"], "ffn": u["k_ffn"]}, statistics,
                                  optimizer, settings_, np.random.default_rng(u["seed"]), g)
        allocation = model.allocation()
        assert (sum(allocation.heads), sum(allocation.ffn)) == budget
        assert all(1 <= h <= 4 for h in allocation.heads) and all(1 <= c <= 12 for c in allocation.ffn)
        for kind, record in records.items():
            assert record.executed <= record.scheduled
            assert len(record.donors) == record.executed
            assert not set(record.donors) & set(young[kind])        # young units are never pruned
            assert record.receiver not in {l for l, _ in record.donors}
        assert_in_sync(model, optimizer)
        for kind in ("heads", "ffn"):
            counts = allocation.heads if kind == "heads" else allocation.ffn
            assert [s.age.numel() for s in statistics.layers[kind]] == list(counts)
    train_step(model, optimizer, *batch(TINY_CCT))   # the resized model still trains


# ------------------------------------------------------------------ the within-layer control

@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(update, min_size=10, max_size=10))
def test_within_layer_updates_replace_units_in_their_own_layer(updates):
    """The control of H1 (data/README.md): the same pruning and cloning, no unit changes layer;
    each clone's parent is a unit of the donor's layer that is not itself pruned."""
    model = tiny_model(TINY_CCT, heads=(2, 3, 1), ffn=(5, 8, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    statistics = UnitStatistics(model)
    train_step(model, optimizer, *batch(TINY_CCT))
    before = model.allocation()
    for u in updates:
        g = randomize_statistics(statistics, u["seed"])
        settings_ = BarterSettings(min_age=u["min_age"], clone_moments=u["clone_moments"], scope="within-layer",
                                   parent_score=u["parent_score"], random_donor=u["random_donor"])
        records = topology_update(model, {"heads": u["k_heads"], "ffn": u["k_ffn"]}, statistics,
                                  optimizer, settings_, np.random.default_rng(u["seed"]), g)
        assert model.allocation() == before
        for kind, record in records.items():
            assert record.receiver is None and record.executed == len(record.donors) <= record.scheduled
            assert sorted(at for at, _ in record.parents) == sorted(at for at, _ in record.donors)
            assert not set(record.parents) & set(record.donors)
        assert_in_sync(model, optimizer)
    train_step(model, optimizer, *batch(TINY_CCT))


def test_within_layer_moves_the_lowest_units_of_all_layers():
    stats = [layer([0.5, 0.1, 0.9, 0.8]), layer([0.05, 0.7]), layer([0.2, 0.3, 0.6])]
    from barter_mini.core.barter import plan_within_layer
    settings_ = BarterSettings(min_age=1, scope="within-layer")
    receiver, donors, parents = plan_within_layer(stats, [4, 2, 3], 4, 3, settings_, settings_.strategies())
    assert receiver is None
    # layer 1 may give one of its two units; the next lowest are layer 0's 0.1 and layer 2's 0.2
    assert sorted(donors) == [(0, 1), (1, 0), (2, 0)]
    assert sorted(parents) == [(0, 2), (1, 1), (2, 2)]
    with pytest.raises(Exception, match="scope"):
        BarterSettings(scope="sideways").validate()
