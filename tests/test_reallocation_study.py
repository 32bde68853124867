"""The reallocation chapter's variants, paired tables and verdicts."""

import math

import pandas as pd
import pytest

from barter_mini.book import reallocation_study as study
from barter_mini.book.profiles import PROFILES
from barter_mini.errors import BarterError


def frame(values: dict[str, list[tuple[float, float]]]) -> pd.DataFrame:
    """variant -> [(val, test) per seed 0, 1, ...]"""
    return pd.DataFrame([{"variant": label, "seed": seed, "val_acc": val, "acc": test}
                         for label, scores in values.items() for seed, (val, test) in enumerate(scores)])


def test_paired_differences_are_taken_seed_by_seed():
    runs = frame({"static": [(80.0, 79.0), (70.0, 69.0), (75.0, 75.0)],
                  "barter": [(81.0, 78.0), (71.0, 70.0), (74.0, 76.0)]})
    paired = study.paired_against(runs, "static").set_index("variant")
    row = paired.loc["barter"]
    # the means differ by 0.33 while the seeds spread over 10 points: pairing removes that spread
    assert row["val_diff_mean"] == pytest.approx(1 / 3)
    assert row["val_diff_std"] == pytest.approx(pd.Series([1.0, 1.0, -1.0]).std())
    assert row["test_diff_mean"] == pytest.approx(1 / 3) and row["val_wins"] == 2 and row["paired_seeds"] == 3
    assert row["val_std"] == pytest.approx(pd.Series([81.0, 71.0, 74.0]).std())
    table = study.paired_table(paired.reset_index(), "static")
    assert list(table["seeds above on validation"]) == ["0 of 3", "2 of 3"]


def test_only_shared_seeds_are_paired():
    runs = frame({"static": [(80.0, 79.0), (70.0, 69.0)], "barter": [(81.0, 78.0), (71.0, 70.0), (90.0, 90.0)]})
    row = study.paired_against(runs, "static").set_index("variant").loc["barter"]
    assert row["seeds"] == 3 and row["paired_seeds"] == 2 and row["val_diff_mean"] == pytest.approx(1.0)


@pytest.mark.parametrize("diffs, side", [([1.0, 1.2, 0.8], "above"), ([-1.0, -1.2, -0.8], "below"),
                                          ([1.0, -1.0, 0.2], "level with")])
def test_verdict_says_which_side_beyond_one_standard_error(diffs, side):
    runs = frame({"static": [(70.0, 70.0)] * 3, "v": [(70.0 + d, 70.0) for d in diffs]})
    sentence = study.verdict(study.paired_against(runs, "static"), "v", "static")
    assert sentence.startswith(f"`v` is {side} `static`")
    std = pd.Series(diffs).std()
    assert f"(standard error {std / math.sqrt(3):.2f};" in sentence


def test_one_seed_is_not_called_a_difference():
    runs = frame({"static": [(70.0, 70.0)], "v": [(72.0, 70.0)]})
    assert "one seed cannot tell" in study.verdict(study.paired_against(runs, "static"), "v", "static")


def test_unknown_variants_and_missing_reference_are_one_line_errors():
    with pytest.raises(BarterError, match="unknown variant 'bigger': choose from static, barter"):
        study.check_labels(["barter", "bigger"])
    with pytest.raises(BarterError, match="variants must name at least one"):
        study.check_labels([])
    with pytest.raises(BarterError, match="needs the reference 'static'"):
        study.paired_against(frame({"barter": [(1.0, 1.0)]}), "static")


def test_defaults_per_profile():
    assert study.study_defaults("smoke") == ([0], list(study.QUICK_DESIGN_VARIANTS))
    seeds, labels = study.study_defaults("quick")
    assert seeds == [0, 1, 2, 3, 4] and labels == list(study.QUICK_DESIGN_VARIANTS)
    assert study.study_defaults("long")[1] == list(study.BOOK_DESIGN_VARIANTS)
    assert set(study.QUICK_DESIGN_VARIANTS) < set(study.BOOK_DESIGN_VARIANTS) <= set(study.DESIGN_VARIANTS)
    assert study.probed_labels(PROFILES["quick"], labels) == ["static", "fresh clone moments", "split clone moments"]
    assert study.probed_labels(PROFILES["long"], study.BOOK_DESIGN_VARIANTS) == [
        "static", "fresh clone moments", "split clone moments", "zero-momentum clones"]
    assert study.study_defaults("quick", [7], ["barter"]) == ([7], ["barter"])
    assert set(study.DEFAULT_SEEDS) == set(PROFILES)


def test_variant_runs_change_one_thing(monkeypatch):
    setup = PROFILES["smoke"]
    plain = study.variant_run(setup, study.VARIANTS["barter"], 0.3, 1)
    piled = study.variant_run(setup, study.VARIANTS["barter x12, piled start"], 0.3, 1)
    assert (piled.start, piled.overrides) == ("first", {"transfer_multiplier": 12.0})
    assert plain.start == "even" and plain.overrides == {} and piled.seed == plain.seed == 1
    ended = {"allocation_history": [{"step": 0, "heads": [3] * 4, "ffn": [39, 39, 38, 38]},
                                    {"step": 40, "heads": [4, 3, 3, 2], "ffn": [30, 39, 38, 47], "transfers": {}}]}
    trained = []
    monkeypatch.setattr(study, "cached_train", lambda run: trained.append(run) or ended)
    found = study.variant_run(setup, study.VARIANTS["static, from barter's end"], 0.3, 1)
    assert trained == [plain]                         # BARTER on the same seed, from the cache
    assert found.method == "static" and found.allocation == {"heads": [4, 3, 3, 2], "ffn": [30, 39, 38, 47]}


def test_update_costs_and_divergence_from_a_probe():
    part = {"units": 3, "receiver": 2, "after_prune": {"loss": 1.1}, "after_clone": {"loss": 1.0},
            "after_exact_clone": {"loss": 1.0}, "after_clone_logit_change": 2e-7,
            "after_exact_clone_logit_change": 1e-7}
    probe = {"probe": {
        "updates": [{"step": 40, "before": {"loss": 1.0}, "after": {"loss": 1.1}, "later": {"20": {"loss": 0.9}},
                     "kinds": {"ffn": part}}],
        "clone_distances": [{"kind": "ffn", "distance": {"1": 0.01, "20": 0.03}},
                            {"kind": "ffn", "distance": {"1": 0.03, "20": 0.05}}],
        "importance": [{"step": 40, "ffn": {"priority": [1.0, 2.0], "total": [3.0, 4.0]},
                        "heads": {"priority": [1.0, 1.0], "total": [1.0, 1.0]}}]}}
    costs = study.update_costs(probe).iloc[0]
    assert costs["prune"] == pytest.approx(0.1) and costs["20 steps later"] == pytest.approx(-0.1)
    assert costs["clone logit change (1e-6)"] == pytest.approx(0.2)
    divergence = study.clone_divergence(probe).set_index("after steps")["distance"]
    assert divergence[1] == pytest.approx(0.02) and divergence[20] == pytest.approx(0.04)
    importance = study.importance_frame({"barter": probe}, "ffn")
    assert list(importance["total"]) == [3.0, 4.0] and list(importance["layer"]) == [0, 1]


def test_every_clone_moment_setting_has_its_variant():
    from barter_mini.core.barter import CLONE_MOMENTS, BarterSettings
    assert set(study.CLONE_MOMENT_VARIANTS) == set(CLONE_MOMENTS)
    for moments, label in study.CLONE_MOMENT_VARIANTS.items():
        assert study.VARIANTS[label].overrides == {"clone_moments": moments}
    assert study.barter_defaults(PROFILES["quick"]).clone_moments == BarterSettings().clone_moments


def test_plain_summary_follows_the_numbers():
    even = frame({"static": [(78.0, 77.0), (77.0, 76.0), (79.0, 78.0)],
                  "barter": [(77.9, 77.0), (77.2, 76.1), (78.8, 78.0)]})
    worse_start = frame({"static": [(78.0, 77.0), (77.0, 76.0), (79.0, 78.0)],
                         "static, from barter's end": [(77.0, 76.0), (76.1, 75.0), (78.2, 77.0)]})
    poor = frame({"static, piled start": [(77.0, 76.0), (76.5, 75.5), (78.0, 77.0)],
                  "static": [(78.0, 77.0), (77.0, 76.0), (79.0, 78.0)],
                  "barter, piled start": [(77.8, 77.0), (77.2, 76.0), (78.9, 78.0)]})
    text = study.plain_summary(study.paired_against(even, "static"), study.paired_against(worse_start, "static"),
                               study.paired_against(poor, "static, piled start"))
    assert text.startswith("At the even start BARTER is level with Static (-0.03 points")
    assert "is below the even Static (-0.90): the allocation the updates move towards is no better" in text
    assert "the even start is worth +0.83 points to Static over the piled one" in text and "BARTER is above Static (+0.80)" in text
    better = frame({"static": [(78.0, 77.0), (77.0, 76.0)], "static, from barter's end": [(79.0, 0.0), (78.2, 0.0)]})
    assert "the updates find a better allocation" in study.plain_summary(
        study.paired_against(even, "static"), study.paired_against(better, "static"),
        study.paired_against(poor, "static, piled start"))
    piled_better = frame({"static, piled start": [(79.0, 76.0), (78.0, 75.5), (80.0, 77.0)],
                          "static": [(78.0, 77.0), (77.0, 76.0), (79.0, 78.0)],
                          "barter, piled start": [(79.0, 77.0), (78.0, 76.0), (80.0, 78.0)]})
    text = study.plain_summary(study.paired_against(even, "static"), study.paired_against(worse_start, "static"),
                               study.paired_against(piled_better, "static, piled start"))
    assert "the piled start is worth +1.00 points to Static over the even one" in text and "worth -" not in text


def test_plain_summary_refuses_to_conclude_from_one_seed():
    one = study.paired_against(frame({"static": [(78.0, 77.0)], "barter": [(79.0, 77.0)]}), "static")
    assert study.plain_summary(one, one, one).startswith("On one seed no difference here can be told")
