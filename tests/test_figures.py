"""Every book figure fits the column unshrunk and shows no text below the floor
(barter_mini.book.figures); the browser test measures the same on the built pages."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402

from barter_mini.book import mechanism, report  # noqa: E402
from barter_mini.book.figures import (BOOK_RC, MAX_WIDTH_IN, SMALLEST_FONT_PT, TEXT_FLOOR_PX, check_figure,  # noqa: E402
                                      plain_log_labels, smallest_text)
from barter_mini.errors import BarterError  # noqa: E402


def _runs():
    return pd.DataFrame([{"method": m, "seed": s, "heads": [3, 4, 2, 3], "ffn": [40, 35, 50, 29]}
                         for m in ("static", "barter") for s in range(3)])


FIGURES = {
    "final_allocations": lambda: report.plot_final_allocations(_runs()),
}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_every_book_figure_fits_the_column_with_text_above_the_floor(name):
    with plt.rc_context(BOOK_RC):
        fig = FIGURES[name]()
        try:
            check_figure(fig, name)
            assert fig.get_figwidth() <= MAX_WIDTH_IN
            assert smallest_text(fig)[0] >= SMALLEST_FONT_PT
        finally:
            plt.close(fig)


def test_the_mechanism_figures_are_svg_with_their_text_as_text(tmp_path):
    for path in mechanism.write_mechanism_figures(tmp_path):
        svg = path.read_text()
        width_pt = float(re.search(r'<svg[^>]* width="([\d.]+)pt"', svg).group(1))
        sizes = [float(size) for size in re.findall(r"font-size: ([\d.]+)px", svg)]
        assert width_pt <= 72 * MAX_WIDTH_IN + 1e-6, path.name
        assert sizes and min(sizes) * 96 / 72 >= TEXT_FLOOR_PX - 1e-6, (path.name, min(sizes))
        assert "<dc:date>" not in svg          # a rebuild of the same model writes the same file


def test_a_wide_figure_and_small_text_are_refused_with_what_is_allowed():
    wide = plt.figure(figsize=(11, 3))
    with pytest.raises(BarterError, match=r"figure 'x' is 11.00 in wide: at most 7 in fits the 688-px column"):
        check_figure(wide, "x")
    small = plt.figure(figsize=(6, 3))
    small.add_subplot().set_title("tiny", fontsize="x-small")
    with pytest.raises(BarterError, match=r"shows 'tiny' at 6.94 pt: at least 7.5 pt \(10 px on the page\)"):
        check_figure(small, "")
    plt.close("all")


def test_a_log_axis_is_labelled_in_plain_numbers():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 4], [0.02, 2.0, 50.0])
    ax.set_yscale("log")
    plain_log_labels(ax.yaxis)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert "0.05" in labels and "10" in labels and not any("^" in label for label in labels)
    plt.close(fig)


