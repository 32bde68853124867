"""No book figure draws a method that its legend does not name."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402

from barter_mini.book import report  # noqa: E402
from barter_mini.book import palette  # noqa: E402
from barter_mini.book.palette import (METHOD_PALETTE, method_style, methods_missing_from_legend,  # noqa: E402
                                     require_method_legend)
from barter_mini.errors import BarterError  # noqa: E402


def test_a_method_drawn_without_a_label_is_found():
    fig, (left, right) = plt.subplots(1, 2)
    try:
        left.plot([0, 1], [0, 1], label="rigl", **method_style("rigl"))
        left.plot([0, 1], [1, 0], **method_style("barter"))                      # no label
        left.axhline(0.5, color=METHOD_PALETTE["dense"], ls="--", label="dense (rho = 1)")
        right.scatter([0, 1], [0, 1], color=METHOD_PALETTE["static"])
        right.bar([0, 1], [1, 2], color=METHOD_PALETTE["set"])
        right.errorbar([0, 1], [0, 1], yerr=[0.1, 0.1], linestyle="none", mfc="white",
                       **method_style("srigl"))
        left.legend()
        assert methods_missing_from_legend(fig) == ["set", "srigl", "static", "barter"]
        with pytest.raises(BarterError, match=r"draws set, srigl, static, barter in its colour") as error:
            require_method_legend(fig)
        assert "\n" not in str(error.value)
        palette.method_legend(fig)   # a figure legend of every label: still nothing names them
        assert methods_missing_from_legend(fig) == ["set", "srigl", "static", "barter"]
        fig.legend([right.collections[0]], ["static, one-shot"])   # "static, ..." names static
        assert methods_missing_from_legend(fig) == ["set", "srigl", "barter"]
    finally:
        plt.close(fig)


def _by_density():
    rows = [{"method": m, "density": d, "acc_mean": 60.0 + i + 10 * d, "acc_std": 0.2, "acc": 60.0 + i,
             "step_ms": 5.0 + i + d, "peak_mem_mb": 3.0 + i, "params": 1e5 * (1 + d + i),
             "train_gflops_per_image": 0.1 * (1 + d + i)}
            for i, m in enumerate(["rigl", "set", "static", "barter"]) for d in (0.1, 0.3)]
    rows.append({"method": "dense", "density": 1.0, "acc_mean": 75.0, "acc_std": 0.1, "acc": 75.0, "step_ms": 20.0,
                 "peak_mem_mb": 9.0, "params": 1e6, "train_gflops_per_image": 2.0})
    return pd.DataFrame(rows)


FIGURES = {
    "accuracy_against_density": lambda: report.plot_accuracy_against_density(_by_density(), _by_density()),
}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_every_book_figure_names_the_methods_it_draws(name):
    fig = FIGURES[name]()     # each ends with require_method_legend: it would raise here
    try:
        assert methods_missing_from_legend(fig) == []
    finally:
        plt.close(fig)


def test_the_figures_that_draw_methods_in_their_colours_are_checked_on_something():
    """The check is not vacuous: these figures do draw methods in the palette's colours."""
    for name in ("accuracy_against_density",):
        fig = FIGURES[name]()
        try:
            drawn = {method for ax in fig.axes for colour in palette._drawn_colours(ax)
                     for method, rgb in METHOD_PALETTE.items() if max(abs(a - b) for a, b in zip(colour, rgb)) < 1e-3}
            assert drawn, name
        finally:
            plt.close(fig)
