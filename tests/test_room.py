"""The room to reallocate: which frozen allocations it trains, and how it pairs them."""

from __future__ import annotations

import pandas as pd
import pytest

from barter_mini.book.room import (ROOM_SEEDS, SEARCH_SEEDS, even_allocation, label_of, one_block_moves,
                                   paired_gaps, room_setup, search_runs, start_runs)
from barter_mini.core.budgets import Allocation


def test_a_one_block_move_keeps_the_budgets_and_moves_one_block_between_two_layers():
    even = Allocation(heads=(3, 3, 3, 3), ffn=(39, 39, 38, 38))
    moves = one_block_moves(even, ffn_block=8)
    assert len(moves) == 2 * 4 * 3                              # both kinds, every ordered pair of layers
    assert moves["heads 0->2"] == {"heads": [2, 3, 4, 3], "ffn": [39, 39, 38, 38]}
    assert moves["ffn 3->1"] == {"heads": [3, 3, 3, 3], "ffn": [39, 47, 38, 30]}
    for allocation in moves.values():
        assert sum(allocation["heads"]) == 12 and sum(allocation["ffn"]) == 154
        assert min(allocation["heads"]) >= 1 and min(allocation["ffn"]) >= 1


def test_a_move_that_would_empty_a_layer_is_left_out():
    moves = one_block_moves(Allocation(heads=(1, 1), ffn=(8, 20)), ffn_block=8)
    assert set(moves) == {"ffn 1->0"}


def test_the_room_trains_every_start_on_its_seeds_and_the_search_on_seeds_of_its_own():
    setup = room_setup()
    even = even_allocation(setup)
    moves = one_block_moves(even)
    starts = start_runs(setup)
    labels = {(label_of(run, moves), run.seed) for run in starts}
    assert labels == {(label, seed) for label in ("even", "piled first", "piled last", "barter") for seed in ROOM_SEEDS}
    search = search_runs(setup)
    assert {run.seed for run in search} == set(SEARCH_SEEDS) and not set(SEARCH_SEEDS) & set(ROOM_SEEDS)
    assert {label_of(run, moves) for run in search} == {"even", *moves}
    assert all(run.method == "static" and run.model == "cct-mini" and run.density == 0.3 for run in search)


def test_gaps_are_paired_by_seed_with_their_standard_error():
    frame = pd.DataFrame({"label": ["even"] * 3 + ["piled last"] * 3, "seed": [0, 1, 2] * 2,
                          "val_acc": [40.0, 50.0, 60.0, 41.0, 52.0, 60.0], "acc": [40.0, 50.0, 60.0] * 2})
    gaps = paired_gaps(frame)
    assert gaps.loc["piled last", "gap_val"] == pytest.approx(1.0)            # d = 1, 2, 0
    assert gaps.loc["piled last", "se_val"] == pytest.approx(1.0 / 3 ** 0.5)    # sd(d) = 1
    assert gaps.loc["piled last", "gap_test"] == 0 and gaps.loc["piled last", "n_val"] == 3


def test_the_recorded_room_holds_whole_stages_in_order_with_their_provenance():
    from barter_mini.book.recorded_grid import DATA_DIR
    from barter_mini.book.room import COMMAND, room_stages

    recorded = pd.read_csv(DATA_DIR / "room.csv", dtype={"commit": "string"})
    names = [stage.name for stage in room_stages()]
    stages = list(dict.fromkeys(recorded["stage"]))
    assert stages == names[:len(stages)] and len(stages) >= 2          # a prefix of the stages, in order
    starts = recorded[recorded["stage"] == names[0]]
    assert starts.groupby("label")["seed"].apply(sorted).to_dict() == {
        label: list(ROOM_SEEDS) for label in ("barter", "even", "piled first", "piled last")}
    assert sorted(recorded.loc[recorded["stage"] == names[1], "seed"]) == list(ROOM_SEEDS)
    assert (recorded["command"] == COMMAND).all() and recorded["commit"].str.fullmatch(r"[0-9a-f]{7,40}").all()
    assert recorded["val_acc"].between(10, 100).all() and recorded["acc"].between(10, 100).all()


def history_entry(step, heads, receiver, donors, executed=None, parents=None):
    executed = len(donors) if executed is None else executed
    return {"step": step, "heads": heads, "ffn": [4, 4],
            "transfers": {"heads": {"receiver": receiver, "donors": donors, "executed": executed,
                                    "parents": parents if parents is not None else list(range(executed))}}}


def test_clones_are_followed_through_later_prunes_and_clones():
    from barter_mini.book.unit_paths import unit_fates
    history = [{"step": 0, "heads": [3, 3], "ffn": [4, 4]},
               history_entry(40, [2, 4], 1, [[0, 1]]),            # clone a at layer 1, place 3
               history_entry(80, [3, 3], 0, [[1, 0]]),            # a moves to place 2; clone b at layer 0, place 2
               history_entry(120, [4, 2], 0, [[1, 2]])]           # a pruned; clone c
    fates = unit_fates(history, "heads")
    assert fates == [{"born": 40, "pruned": 120}, {"born": 80, "pruned": None}, {"born": 120, "pruned": None}]


def test_within_layer_clones_are_appended_before_the_donors_go():
    from barter_mini.book.unit_paths import unit_fates
    history = [{"step": 0, "heads": [2, 2], "ffn": [4, 4]},
               history_entry(40, [2, 2], None, [[0, 0]], parents=[[0, 1]]),   # clone a: layer 0, place 1
               history_entry(80, [2, 2], None, [[0, 1]], parents=[[0, 0]])]   # a pruned
    assert unit_fates(history, "heads") == [{"born": 40, "pruned": 80}, {"born": 80, "pruned": None}]


def test_a_history_whose_widths_do_not_follow_from_its_transfers_is_refused():
    from barter_mini.book.unit_paths import unit_fates
    from barter_mini.errors import BarterError
    history = [{"step": 0, "heads": [3, 3], "ffn": [4, 4]}, history_entry(40, [3, 3], 1, [[0, 1]])]
    with pytest.raises(BarterError, match="do not follow"):
        unit_fates(history, "heads")


def test_h1_trains_static_barter_and_its_within_layer_control_on_fresh_seeds():
    from barter_mini.book.room import H1_CONFIRM_SEEDS, H1_SEEDS, h1_stages
    setup = room_setup()
    moves = one_block_moves(even_allocation(setup))
    test, fresh, confirmation, derivation = (stage.runs() for stage in h1_stages(setup))
    assert {(label_of(run, moves), run.seed) for run in test} == {
        (label, seed) for label in ("even", "barter", "barter within-layer") for seed in H1_SEEDS}
    assert {run.seed for run in confirmation} == set(H1_CONFIRM_SEEDS)
    used = set(ROOM_SEEDS) | set(SEARCH_SEEDS)
    assert not (set(H1_SEEDS) | set(H1_CONFIRM_SEEDS)) & used and not set(H1_SEEDS) & set(H1_CONFIRM_SEEDS)
    within = [run for run in test if run.method_settings_changes()]
    assert len(within) == len(H1_SEEDS) and all(run.method_settings_changes() == {"scope": "within-layer"}
                                                for run in within)
    from barter_mini.training.optimization import resolve_recipe
    assert resolve_recipe(within[0], "cct").barter.scope == "within-layer"
    assert {(label_of(run, moves), run.seed) for run in fresh} == {
        (label, seed) for label in ("piled last", "barter as derived") for seed in H1_SEEDS}
    assert {(label_of(run, moves), run.seed) for run in derivation} == {
        (label, seed) for label in ("pruning by Taylor^2", "split clone moments") for seed in H1_SEEDS}


def test_a_path_keeps_the_start_and_the_updates_that_moved_units():
    from barter_mini.book.unit_paths import path_rows
    idle = {"step": 160, "heads": [2, 4], "ffn": [4, 4],
            "transfers": {"heads": {"receiver": None, "donors": [], "executed": 0, "parents": []}}}
    metrics = {"allocation_history": [{"step": 0, "heads": [3, 3], "ffn": [4, 4]},
                                      history_entry(40, [2, 4], 1, [[0, 1]]), idle]}
    rows = path_rows(metrics)
    assert [row["step"] for row in rows] == [0, 40]
    assert rows[1]["heads"] == (2, 4) and rows[1]["receiver_heads"] == 1 and rows[1]["moved_heads"] == 1
    assert rows[1]["receiver_ffn"] is None and rows[0]["moved_ffn"] == 0


def test_the_recorded_path_starts_even_and_moves_what_the_room_records():
    from barter_mini.book.recorded_grid import DATA_DIR
    path = pd.read_csv(DATA_DIR / "room_path.csv")
    room = pd.read_csv(DATA_DIR / "room.csv").query("label == 'barter'").set_index("seed")
    assert sorted(path["seed"].unique()) == list(ROOM_SEEDS)
    for seed, steps in path.groupby("seed"):
        assert steps.iloc[0]["step"] == 0 and steps.iloc[0]["heads"] == "(3, 3, 3, 3)"
        assert steps.iloc[-1]["heads"] == room.loc[seed, "heads"] and steps.iloc[-1]["ffn"] == room.loc[seed, "ffn"]
        assert steps["moved_heads"].sum() == room.loc[seed, "moved_heads"]
        assert steps["moved_ffn"].sum() == room.loc[seed, "moved_ffn"]


def test_the_recorded_h1_runs_hold_whole_stages_on_their_own_seeds():
    from barter_mini.book.recorded_grid import DATA_DIR
    from barter_mini.book.room import H1_COMMAND, H1_CONFIRM_SEEDS, H1_SEEDS, h1_stages

    recorded = pd.read_csv(DATA_DIR / "room_h1.csv", dtype={"commit": "string"})
    names = [stage.name for stage in h1_stages()]
    stages = list(dict.fromkeys(recorded["stage"]))
    assert stages == names[:len(stages)] and len(stages) >= 3        # recorded stage by stage, in order
    expected = {names[0]: (("even", "barter", "barter within-layer"), H1_SEEDS),
                names[1]: (("piled last", "barter as derived"), H1_SEEDS),
                names[2]: (("even", "barter", "barter within-layer"), H1_CONFIRM_SEEDS),
                names[3]: (("pruning by Taylor^2", "split clone moments"), H1_SEEDS)}
    for name, (labels, seeds) in expected.items():
        if name not in stages:
            continue
        runs = recorded[recorded["stage"] == name]
        assert runs.groupby("label")["seed"].apply(sorted).to_dict() == {label: list(seeds) for label in labels}
    assert (recorded["command"] == H1_COMMAND).all() and recorded["commit"].str.fullmatch(r"[0-9a-f]{7,40}").all()
    within = recorded[recorded["label"] == "barter within-layer"]
    assert (within["heads"] == "(3, 3, 3, 3)").all() and (within["ffn"] == "(39, 39, 38, 38)").all()
    assert (within["moved_heads"] > 0).all() and (within["displaced_heads"] == 0).all()
    path = pd.read_csv(DATA_DIR / "room_h1_path.csv")
    assert set(path["label"]) == set(recorded["label"]) - {"even", "piled last"}
    barter = recorded[recorded["label"].str.startswith("barter") | recorded["label"].str.contains("clone|Taylor")]
    assert barter[["twins_heads", "twins_ffn"]].notna().all().all()
    assert path.loc[path["label"] == "barter within-layer", "receiver_heads"].isna().all()


def test_a_clone_in_lockstep_with_its_parent_is_a_twin_and_independent_units_are_not():
    import torch

    from barter_mini.book.unit_paths import twins
    from barter_mini.core.barter import clone
    from barter_mini.core.unit_statistics import UnitStatistics

    from helpers import TINY_CCT, tiny_model
    torch.manual_seed(0)
    model = tiny_model(TINY_CCT, heads=(2, 3, 1), ffn=(5, 8, 3))
    assert twins(model, "heads") == 0 and twins(model, "ffn") == 0
    statistics = UnitStatistics(model)
    clone(model.blocks[1], "ffn", [0, 3], statistics.layers["ffn"][1], None, symmetry_noise=1e-3)
    clone(model.blocks[0], "heads", [1], statistics.layers["heads"][0], None, symmetry_noise=0.0)
    assert twins(model, "ffn") == 4 and twins(model, "heads") == 2


def test_the_method_chapter_states_only_what_the_derivation_runs_give():
    import re
    from pathlib import Path

    from barter_mini.book.room import derivation_substitutions
    subs = derivation_substitutions()           # checks the chapter's claims on data/room_h1.csv
    method = (Path(__file__).resolve().parents[1] / "book" / "method.md").read_text()
    used = set(re.findall(r"\{\{ (derivation_\w+) \}\}", method))
    assert used and used <= set(subs), used - set(subs)
    assert subs["derivation_derived_same_receiver"] == "100%"
