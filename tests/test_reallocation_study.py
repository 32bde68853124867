"""The reallocation chapter's variants and the runs that train them."""

import pytest

from barter_mini.book import profiles
from barter_mini.book import reallocation_study as study
from barter_mini.book.profiles import PROFILES
from barter_mini.errors import BarterError


def test_unknown_variants_are_one_line_errors():
    with pytest.raises(BarterError, match="unknown variant 'bigger': choose from static, barter"):
        study.check_labels(["barter", "bigger"])
    with pytest.raises(BarterError, match="variants must name at least one"):
        study.check_labels([])


def test_defaults_per_profile():
    assert study.study_defaults("smoke") == ([0], list(study.QUICK_DESIGN_VARIANTS))
    seeds, labels = study.study_defaults("quick")
    assert seeds == [0, 1, 2] and labels == list(study.QUICK_DESIGN_VARIANTS)
    assert study.study_defaults("long")[0] == [0, 1, 2, 3, 4]
    assert study.study_defaults("long")[1] == list(study.BOOK_DESIGN_VARIANTS)
    assert set(study.QUICK_DESIGN_VARIANTS) < set(study.BOOK_DESIGN_VARIANTS) <= set(study.DESIGN_VARIANTS)
    assert study.study_defaults("quick", [7], ["barter"]) == ([7], ["barter"])
    assert set(study.DEFAULT_SEEDS) == set(PROFILES)


def test_variant_runs_change_one_thing(monkeypatch):
    setup = PROFILES["smoke"]
    plain = study.variant_run(setup, study.VARIANTS["barter"], 0.3, 1)
    piled = study.variant_run(setup, study.VARIANTS["barter x12, piled start"], 0.3, 1)
    assert (piled.start, piled.method_settings_changes()) == ("first", {"transfer_multiplier": 12.0})
    assert plain.start == "even" and plain.method_settings_changes() == {} and piled.seed == plain.seed == 1
    ended = {"allocation_history": [{"step": 0, "heads": [3] * 4, "ffn": [39, 39, 38, 38]},
                                    {"step": 40, "heads": [4, 3, 3, 2], "ffn": [30, 39, 38, 47], "transfers": {}}]}
    trained = []
    monkeypatch.setattr(profiles, "cached_train", lambda run, *cache: trained.append(run) or ended)
    found = study.variant_run(setup, study.VARIANTS["static, from barter's end"], 0.3, 1)
    assert trained == [plain]                         # BARTER on the same seed, from the cache
    assert found.method == "static" and found.allocation == {"heads": [4, 3, 3, 2], "ffn": [30, 39, 38, 47]}


def test_every_clone_moment_setting_has_its_variant():
    from barter_mini.core.barter import CLONE_MOMENTS, BarterSettings
    assert set(study.CLONE_MOMENT_VARIANTS) == set(CLONE_MOMENTS)
    for moments, label in study.CLONE_MOMENT_VARIANTS.items():
        assert study.VARIANTS[label].changes == {"clone_moments": moments}
    assert study.barter_defaults(PROFILES["quick"]).clone_moments == BarterSettings().clone_moments
