"""The book's report helpers: the method palette, the readable page tables and the
walkthrough's step-by-step update."""

from __future__ import annotations

import colorsys
import itertools

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from barter_mini.book import profiles, report  # noqa: E402
from barter_mini.book.experiments import run_grid  # noqa: E402
from barter_mini.book.profiles import PROFILES  # noqa: E402
from barter_mini.book.tables import HEADERS, column_words  # noqa: E402
from barter_mini.book.palette import BARTER_COLOR, METHOD_MARKERS, METHOD_ORDER, METHOD_PALETTE  # noqa: E402
from barter_mini.book.report import RUN_COLUMNS, readable  # noqa: E402
from barter_mini.book.walkthrough import walkthrough_run  # noqa: E402
from barter_mini.core.barter import (BarterSettings, clone, prune_donors, receiver_room, select_donors,  # noqa: E402
                                     select_parents, select_receiver, transfer_units)
from barter_mini.core.unit_statistics import UnitStatistics  # noqa: E402
from barter_mini.errors import BarterError  # noqa: E402
from barter_mini.training.methods import METHODS  # noqa: E402
from barter_mini.training.trainer import RunConfig  # noqa: E402

from helpers import TINY_CCT, batch, tiny_model, train_step  # noqa: E402

DENSITIES = [0.1, 0.3, 0.5, 0.7]


# --- the method palette -------------------------------------------------------------------

#: every pair of chromatic methods differs in hue by at least this many degrees
MIN_HUE_DEGREES = 30.0
#: and every pair of methods by at least this CIELAB distance (CIE76 Delta E; ~2.3 is a just
#: noticeable difference, 20+ reads as a different colour at a glance)
MIN_DELTA_E = 20.0
#: an HLS saturation below this is a grey, whose hue means nothing
GREY_SATURATION = 0.1


def hue_degrees(rgb) -> float:
    return 360.0 * colorsys.rgb_to_hls(*rgb)[0]


def hue_distance(a, b) -> float:
    d = abs(hue_degrees(a) - hue_degrees(b)) % 360.0
    return min(d, 360.0 - d)


def lab(rgb) -> np.ndarray:
    """sRGB (0-1) to CIELAB under D65."""
    c = np.asarray(rgb, dtype=float)
    c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ c
    xyz /= np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def delta_e(a, b) -> float:
    return float(np.linalg.norm(lab(a) - lab(b)))


def nearest(method: str, distance, among) -> float:
    return min(distance(METHOD_PALETTE[method], METHOD_PALETTE[other]) for other in among if other != method)


def test_every_method_has_a_colour():
    assert set(METHOD_PALETTE) == set(METHOD_ORDER) == set(METHODS)
    assert all(len(rgb) == 3 and all(0 <= c <= 1 for c in rgb) for rgb in METHOD_PALETTE.values())


def test_no_two_methods_share_a_hue():
    saturation = {m: colorsys.rgb_to_hls(*rgb)[2] for m, rgb in METHOD_PALETTE.items()}
    greys = [m for m, s in saturation.items() if s < GREY_SATURATION]
    assert greys == ["dense"], f"only dense, the reference line, may be grey: {greys}"
    chromatic = [m for m in METHOD_ORDER if m not in greys]
    assert min(saturation[m] for m in chromatic) >= 0.4, "a coloured method must not look grey"
    for a, b in itertools.combinations(chromatic, 2):
        assert hue_distance(METHOD_PALETTE[a], METHOD_PALETTE[b]) >= MIN_HUE_DEGREES - 1e-9, (  # float rounding
            f"{a} and {b} are {hue_distance(METHOD_PALETTE[a], METHOD_PALETTE[b]):.1f} degrees of hue apart")
    for a, b in itertools.combinations(METHOD_ORDER, 2):
        assert delta_e(METHOD_PALETTE[a], METHOD_PALETTE[b]) >= MIN_DELTA_E, (
            f"{a} and {b} are only {delta_e(METHOD_PALETTE[a], METHOD_PALETTE[b]):.1f} apart in CIELAB")


def test_barter_is_the_colour_a_reader_finds_at_once():
    chromatic = [m for m in METHOD_ORDER if m != "dense"]
    others = [m for m in chromatic if m != "barter"]
    # further in hue from its nearest neighbour than any other method is from its own
    barter_hue = nearest("barter", hue_distance, chromatic)
    assert barter_hue > max(nearest(m, hue_distance, chromatic) for m in others)
    assert barter_hue >= 45.0 - 1e-9  # float rounding
    # and likewise in CIELAB, against every colour including dense's grey
    barter_lab = nearest("barter", delta_e, METHOD_ORDER)
    assert barter_lab > 1.5 * max(nearest(m, delta_e, METHOD_ORDER) for m in others)
    # the one fully saturated colour
    hsv_saturation = {m: colorsys.rgb_to_hsv(*METHOD_PALETTE[m])[1] for m in METHOD_ORDER}
    assert hsv_saturation["barter"] == 1.0 > max(hsv_saturation[m] for m in others)
    assert METHOD_PALETTE["barter"] == BARTER_COLOR


#: BARTER's nearest other method under each simulated colour-vision deficiency, in CIELAB
MIN_CVD_DELTA_E = 18.0


@pytest.mark.parametrize("deficiency", ["protanomaly", "deuteranomaly", "tritanomaly"])
def test_barter_stands_out_for_colour_blind_readers(deficiency):
    """Under a full (severity 100) simulated deficiency (Machado et al. 2009, through
    colorspacious), BARTER stays at least MIN_CVD_DELTA_E from every other method's colour,
    dense's grey included: the red-green pairs of the first palette were under 10."""
    from colorspacious import cspace_convert
    space = {"name": "sRGB1+CVD", "cvd_type": deficiency, "severity": 100}
    seen = {m: np.clip(cspace_convert(rgb, space, "sRGB1"), 0, 1) for m, rgb in METHOD_PALETTE.items()}
    nearest_other = min(METHOD_ORDER[:-1], key=lambda m: delta_e(seen["barter"], seen[m]))
    assert METHOD_ORDER[-1] == "barter"
    assert delta_e(seen["barter"], seen[nearest_other]) >= MIN_CVD_DELTA_E, (
        f"under {deficiency} barter and {nearest_other} are "
        f"{delta_e(seen['barter'], seen[nearest_other]):.1f} apart in CIELAB")


def test_every_method_has_its_own_marker():
    assert set(METHOD_MARKERS) == set(METHOD_ORDER)
    assert len(set(METHOD_MARKERS.values())) == len(METHOD_MARKERS)


# --- readable page tables -----------------------------------------------------------------

def test_readable_selects_renames_rounds_and_blanks():
    frame = pd.DataFrame({"method": ["rigl", "barter"], "density": [0.3, 0.3], "step_ms": [12.3456, 7.0],
                          "acc": [70.123, np.nan], "runs": [1, 0], "noise": ["x", "y"]}, index=[4, 7])
    shown = readable(frame, {"method": "method", "step_ms": "ms/step", "acc": "Top-1 (%)", "runs": "runs"}, 2)
    assert list(shown.columns) == ["method", "ms/step", "Top-1 (%)", "runs"]
    assert list(shown.index) == [0, 1]                       # row numbers renumbered
    assert list(shown["ms/step"]) == [12.35, 7.0]
    assert list(shown["Top-1 (%)"]) == ["70.12", ""]         # no run: a blank cell, not NaN
    assert list(shown["runs"]) == [1, 0] and shown["runs"].dtype.kind == "i"
    assert frame.loc[4, "step_ms"] == 12.3456                # the frame itself is untouched
    per_column = readable(frame, {"step_ms": "ms/step", "density": "rho"}, {"step_ms": 1})
    assert list(per_column["ms/step"]) == [12.3, 7.0]
    with pytest.raises(BarterError, match="no column 'wall_time_s' to show"):
        readable(frame, {"wall_time_s": "wall time (s)"})


def test_readable_keeps_a_named_index():
    rows = [{"method": m, "density": d, "step_ms": 1.23456} for m in ("rigl", "barter") for d in (0.1, 0.3)]
    pivot = pd.DataFrame(rows).pivot(index="method", columns="density", values="step_ms")
    shown = readable(pivot.reset_index(), {"method": "method", 0.1: "rho = 0.1"}, 1)
    assert list(shown["rho = 0.1"]) == [1.2, 1.2]
    assert readable(pivot, {0.3: "rho = 0.3"}, 2).index.name == "method"


def test_page_tables_name_columns_the_notebooks_produce(monkeypatch):
    """Every column list of the package fits the frame it is applied to."""

    def fake_train(run, *cache):
        return {"val_acc": 0.5, "val_macro_f1": 0.4, "test_acc": 0.5, "test_macro_f1": 0.4, "wall_time_s": 1.0,
                "params": 1000, "allocation": {"heads": [1, 2], "ffn": [3, 4]}}

    monkeypatch.setattr(profiles, "cached_train", fake_train)
    runs = run_grid(PROFILES["smoke"], ["dense", "barter"], [0.3], [0], progress=False)
    shown = readable(runs, RUN_COLUMNS, 2)
    assert list(shown.columns) == ["method", "density", "seed", "test Top-1 (%)", "test macro-F1 (%)", "wall time (s)",
                                   "parameters", "heads"]
    assert list(shown["test Top-1 (%)"]) == [50.0, 50.0]


def test_every_column_list_takes_its_words_from_the_one_header_map():
    """A column reads the same in every table: the lists name columns, tables.HEADERS words them."""
    lists = {name: value for name, value in vars(report).items() if name.endswith("_COLUMNS")}
    assert lists, "report.py lists no columns"
    for name, columns in lists.items():
        assert isinstance(columns, tuple) and all(isinstance(c, str) for c in columns), name
        frame = pd.DataFrame({column: [1.0] for column in columns})
        assert list(readable(frame, columns).columns) == [column_words(c) for c in columns], name
    assert column_words("update_ms_per_step") == HEADERS["update_ms_per_step"] == "update ms/step"


# --- the walkthrough's update, step by step --------------------------------------------------

@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_walkthrough_run_is_the_run_the_notebook_trained(profile):
    """Same RunConfig (and so the same cache entry) as the one the notebook used to build."""
    setup = PROFILES[profile]
    by_hand = RunConfig(method="barter", model=setup.model, dataset=setup.dataset, density=0.3, seed=2,
                        recipe=setup.recipe, epochs=setup.epochs, train_subset=setup.train_subset,
                        precision=setup.precision, progress=False)
    assert walkthrough_run(setup, 0.3, 2) == by_hand


def warmed_tiny(seed: int = 0):
    model = tiny_model(TINY_CCT, heads=(2, 3, 1), ffn=(5, 8, 3), seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    statistics = UnitStatistics(model)
    for step in range(4):
        train_step(model, optimizer, *batch(TINY_CCT, seed=step))
    return model, optimizer, statistics


def test_the_walkthroughs_steps_make_the_librarys_update():
    """Receiver, donors and parents chosen by the selection rules, cloned and pruned one step
    at a time as the walkthrough does, give the model that one call of ``transfer_units``
    gives (symmetry noise off), the clone splitting Adam's first moment by ``alpha``."""
    kind, most = "ffn", 3
    model, optimizer, statistics = warmed_tiny()
    stats = statistics.layers[kind]
    counts = list(model.allocation().ffn)
    receiver = select_receiver(stats, counts, TINY_CCT.ffn_per_layer)
    k = receiver_room(counts, receiver, TINY_CCT.ffn_per_layer, most)
    donors = select_donors(stats, counts, receiver, k, min_age=1)
    parents = select_parents(stats[receiver], len(donors))
    assert len(donors) == len(parents) == k > 0 and all(layer != receiver for layer, _ in donors)

    fc1 = model.blocks[receiver].mlp.fc1.weight
    first_moment = optimizer.state[fc1]["exp_avg"][parents[0]].clone()
    clone(model.blocks[receiver], kind, parents, stats[receiver], optimizer, alpha=0.5, symmetry_noise=0.0,
          clone_moments="split")
    split = optimizer.state[model.blocks[receiver].mlp.fc1.weight]["exp_avg"]
    torch.testing.assert_close(split[parents[0]], 0.5 * first_moment)
    torch.testing.assert_close(split[counts[receiver]], 0.5 * first_moment)   # the first clone, appended
    prune_donors(model, kind, donors, stats, optimizer)

    reference, reference_optimizer, reference_statistics = warmed_tiny()
    record = transfer_units(reference, kind, most, reference_statistics, reference_optimizer,
                            BarterSettings(min_age=1, symmetry_noise=0.0))
    assert (record.receiver, record.donors, record.parents) == (receiver, donors, parents)
    assert model.allocation() == reference.allocation()
    assert sum(model.allocation().ffn) == sum(counts)
    for (name, ours), (_, theirs) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-8, msg=name)
    with pytest.raises(BarterError, match="unknown unit kind 'neurons'"):
        prune_donors(model, "neurons", donors, stats, optimizer)
