"""No book figure draws a method that its legend does not name."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402

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
