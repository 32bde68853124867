"""The mechanism's pictures are drawn from a real update, and say what the code does."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402

from barter_mini.book.mechanism import (FIGURES, one_update, plot_compact_layer, plot_moment_remap,  # noqa: E402
                                        plot_update, trained_compact_model, write_mechanism_figures)


@pytest.fixture(scope="module")
def update():
    model, optimizer, statistics = trained_compact_model(density=0.3, steps=3)
    return model, one_update(model, optimizer, statistics, alpha=0.3)


def test_one_update_moves_channels_under_the_budget(update):
    model, record = update
    assert sum(record.after) == sum(record.before) and list(model.allocation().ffn) == record.after
    assert record.after[record.receiver] == record.before[record.receiver] + len(record.parents) > record.before[record.receiver]
    assert all(layer != record.receiver for layer, _ in record.donors) and len(record.donors) == len(record.parents)


def test_the_recorded_moments_follow_the_derived_factors(update):
    _, record = update
    alpha = record.alpha
    assert record.moment_ratios["in", "exp_avg"] == pytest.approx((alpha, 1 - alpha), rel=1e-5)
    assert record.moment_ratios["in", "exp_avg_sq"] == pytest.approx((alpha ** 2, (1 - alpha) ** 2), rel=1e-5)
    assert record.moment_ratios["out", "exp_avg"] == pytest.approx((1.0, 1.0), rel=1e-5)
    assert record.moment_ratios["out", "exp_avg_sq"] == pytest.approx((1.0, 1.0), rel=1e-5)


def test_the_figures_name_every_role(update, tmp_path):
    model, record = update
    labels = [t.get_text() for t in plot_update(record).legends[0].get_texts()]
    assert [label.split(" ")[0] for label in labels] == ["donor", "parent", "clone"] and "0.3" in labels[1]
    layer = plot_compact_layer(model, record.receiver)
    assert f"{record.after[record.receiver]} of 128 FFN channels" in layer.axes[0].get_title()
    remap = plot_moment_remap(record)
    assert {t.get_text() for t in remap.axes[0].get_legend().get_texts()} == {"measured", "derived factor"}
    plt.close("all")
    paths = write_mechanism_figures(tmp_path / "figures")
    assert [p.name for p in paths] == list(FIGURES) and all(p.stat().st_size > 10_000 for p in paths)
