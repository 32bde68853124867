"""How the book's figures reach the page readable: one width, one text floor, real text.

A figure is drawn at most :data:`MAX_WIDTH_IN` inches wide and with no text smaller than
:data:`SMALLEST_FONT_PT` points, then written as SVG with its text kept as text
(``svg.fonttype: none``). Shown at its natural size, one point of an SVG is 96 / 72 CSS
pixels, so a 7-inch figure is 672 px wide, inside the 688-px text column of the book at a
1280-px window, and its smallest text is ``7.5 * 96 / 72 = 10`` px: the floor
(:data:`TEXT_FLOOR_PX`) that the browser test measures on every page.

A notebook calls :func:`use_book_figures` once and hands each figure to :func:`show`, which
checks it (:func:`check_figure`) and glues it under a name; the page shows it with a
numbered caption through MyST-NB's ``{glue:figure}`` directive.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import seaborn as sns
from cycler import cycler
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from matplotlib.text import Text

from ..errors import BarterError

#: the text column of a book page at a 1280-px window (sphinx-book-theme), CSS pixels
COLUMN_PX = 688
#: CSS pixels per point of an SVG shown at its natural size
PX_PER_PT = 96 / 72
#: the widest figure, inches: ``7 * 72 * 96 / 72 = 672`` px, inside :data:`COLUMN_PX`
MAX_WIDTH_IN = 7.0
#: the smallest text a figure may show on the page, CSS pixels
TEXT_FLOOR_PX = 10.0
#: the smallest font a figure may use, points (:data:`TEXT_FLOOR_PX` / :data:`PX_PER_PT`)
SMALLEST_FONT_PT = TEXT_FLOOR_PX / PX_PER_PT

#: the colours of whatever a figure draws without a method's own colour (variants, layers,
#: kinds of work): seaborn's colour-blind-safe palette
CYCLE_COLORS = sns.color_palette("colorblind")
#: how far (inches) a drawn thing may reach past the figure's edge before it counts as clipped
CLIP_TOLERANCE_IN = 0.02
#: matplotlib settings of every book figure: SVG keeps its text as text (so a browser can
#: measure it and a reader can select it); relative sizes ("small" = 0.833 of 10 pt) stay
#: above :data:`SMALLEST_FONT_PT`; the colour cycle is :data:`CYCLE_COLORS`
BOOK_RC = {"svg.fonttype": "none", "font.size": 10.0, "axes.titlesize": 10.5, "axes.labelsize": 10.0,
           "xtick.labelsize": 9.0, "ytick.labelsize": 9.0, "legend.fontsize": 9.0,
           "legend.title_fontsize": 9.0, "figure.titlesize": 11.0,
           "axes.prop_cycle": cycler(color=CYCLE_COLORS)}


def use_book_figures() -> None:
    """Draw with :data:`BOOK_RC` and show figures as SVG (the notebooks call this first)."""
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    plt.rcParams.update(BOOK_RC)
    # the figure as drawn, never grown or cropped to what it holds: its width is the width
    # checked (check_figure also checks that nothing reaches past its edges)
    set_matplotlib_formats("svg", bbox_inches=None)


def _shown_texts(fig) -> list[Text]:
    return [text for text in fig.findobj(Text) if text.get_visible() and text.get_text().strip()]


def smallest_text(fig) -> tuple[float, str]:
    """The smallest font size (points) of the text ``fig`` shows, and that text."""
    texts = _shown_texts(fig)
    if not texts:
        return float("inf"), ""
    text = min(texts, key=Text.get_fontsize)
    return float(text.get_fontsize()), text.get_text()


def check_figure(fig, name: str = "") -> None:
    """Raise a one-line :class:`~barter_mini.errors.BarterError` when ``fig`` would be
    shrunk to fit the column (wider than :data:`MAX_WIDTH_IN`), draws text or a legend past
    its edges (which the page would clip), or shows text smaller than
    :data:`SMALLEST_FONT_PT`."""
    label = f"figure {name!r}" if name else "the figure"
    width = float(fig.get_figwidth())
    if width > MAX_WIDTH_IN + 1e-9:
        raise BarterError(f"{label} is {width:.2f} in wide: at most {MAX_WIDTH_IN:g} in fits the "
                          f"{COLUMN_PX}-px column unshrunk (stack its panels)")
    fig.draw_without_rendering()  # lays the figure out (constrained layout) as saving it would
    box = fig.get_tightbbox()  # inches; what is drawn, text and legends included
    if box.x0 < -CLIP_TOLERANCE_IN or box.y0 < -CLIP_TOLERANCE_IN or box.x1 > width + CLIP_TOLERANCE_IN \
            or box.y1 > fig.get_figheight() + CLIP_TOLERANCE_IN:
        raise BarterError(f"{label} draws outside itself ({box.x0:.2f}, {box.y0:.2f}) to ({box.x1:.2f}, "
                          f"{box.y1:.2f}) in, which the page would clip: keep legends and labels inside "
                          f"(constrained layout, loc='outside ...')")
    size, text = smallest_text(fig)
    if size < SMALLEST_FONT_PT - 1e-9:
        raise BarterError(f"{label} shows {text!r} at {size:.2f} pt: at least {SMALLEST_FONT_PT:g} pt "
                          f"({TEXT_FLOOR_PX:g} px on the page)")


def show(name: str, fig) -> None:
    """Check ``fig`` (:func:`check_figure`) and glue it as ``name`` for a ``{glue:figure}``
    directive of the page, which numbers and captions it; the figure is closed, so it is not
    also shown bare at the end of the cell."""
    from myst_nb import glue

    check_figure(fig, name)
    glue(name, fig, display=False)
    plt.close(fig)


def stacked_panels(count: int, panel_height_in: float, legend_in: float = 0.0, **subplots):
    """``count`` panels one above the other at the book's width (:data:`MAX_WIDTH_IN`): a
    figure too wide for the column side by side is stacked instead of shrunk. Returns
    ``(fig, axes)`` with ``axes`` a flat array; ``legend_in`` leaves room below for a figure
    legend."""
    fig, axes = plt.subplots(count, 1, figsize=(MAX_WIDTH_IN, panel_height_in * count + legend_in),
                             constrained_layout=True, squeeze=False, **subplots)
    return fig, axes[:, 0]


def plain_log_labels(axis) -> None:
    """Label a log ``axis`` in plain numbers at 1, 2 and 5 of each power of ten (0.02, 0.05,
    0.1), instead of powers of ten; minor ticks stay unlabelled."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())
