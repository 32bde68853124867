"""One colour and one marker per method, shared by every figure of the book, and the check
that a figure's legend names every method it draws (:func:`require_method_legend`)."""

from __future__ import annotations

import colorsys

from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.colors import to_rgba

from ..errors import BarterError
from ..training.methods import METHODS


#: BARTER's colour: a fully saturated dark red, alone in its part of the hue circle and, for
#: readers with any of the three colour-vision deficiencies, further from every other method
#: than the book's tests require (simulated with colorspacious)
BARTER_COLOR = METHODS["barter"].look.color
#: dense, the full-density reference, is the one grey
DENSE_COLOR = METHODS["dense"].look.color
#: hue (degrees) kept clear on either side of BARTER's red
BARTER_HUE_GAP = 45.0


def method_order() -> tuple[str, ...]:
    """The book's methods, in the order of its tables and legends: the registry's
    (:data:`~barter_mini.training.methods.METHODS`)."""
    return tuple(METHODS)


def method_markers() -> dict[str, str]:
    """One marker per method, so that no figure depends on colour alone: BARTER the large star."""
    return {name: method.look.marker for name, method in METHODS.items()}


def method_palette() -> dict[str, tuple[float, float, float]]:
    """One RGB colour per method of the registry, from its :class:`~barter_mini.training.methods.Look`.

    A method with a fixed colour keeps it (BARTER a fully saturated red, dense grey); the
    others take hue slots evenly spaced over the circle outside BARTER's gap: slot ``k`` of
    ``n`` at ``BARTER_HUE_GAP + k (360 - 2 BARTER_HUE_GAP) / (n - 1)`` degrees (30 degrees
    apart for the ten of today), so no two methods share a hue and BARTER's nearest
    neighbour is further from it (45 degrees) than any other method's.
    """
    slots = sorted(method.look.hue_slot for method in METHODS.values() if method.look.color is None)
    step = (360.0 - 2 * BARTER_HUE_GAP) / max(len(slots) - 1, 1)
    palette = {}
    for name, method in METHODS.items():
        look = method.look
        if look.color is not None:
            palette[name] = tuple(float(c) for c in look.color)
        else:
            hue = (BARTER_HUE_GAP + slots.index(look.hue_slot) * step) / 360.0
            palette[name] = tuple(float(c) for c in colorsys.hls_to_rgb(hue, look.lightness, look.saturation))
    return palette


#: what :func:`method_order`, :func:`method_palette` and :func:`method_markers` give, read
#: from the registry when the name is imported
_FROM_REGISTRY = {"METHOD_ORDER": method_order, "METHOD_PALETTE": method_palette, "METHOD_MARKERS": method_markers}


def __getattr__(name: str):
    if name in _FROM_REGISTRY:
        return _FROM_REGISTRY[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def method_style(method: str) -> dict:
    """Colour, marker and size of ``method``'s points and lines: BARTER drawn larger and on top."""
    barter = method == "barter"
    return {"color": method_palette()[method], "marker": METHODS[method].look.marker, "ms": 11 if barter else 6,
            "zorder": 3 if barter else 2}


def _method_named(label: str) -> str:
    """The method a legend label names: its first word, before any comma or space
    ("barter", "barter, matched", "dense (rho = 1)")."""
    return label.split(",")[0].split(" ")[0]


def method_legend(fig, columns: int = 6):
    """One legend for the whole figure, below its panels and off the data: every label drawn
    in any panel once, methods in the book's order (BARTER first, where the eye starts),
    anything else (paper rows, references) after them."""
    handles = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    def rank(label: str) -> tuple[int, int]:
        method = _method_named(label)
        if method == "barter":
            return (0, 0)
        order = method_order()
        return (1, order.index(method)) if method in order else (2, 0)
    labels = sorted(handles, key=rank)
    if not labels:
        return None
    # as many columns as the widest label lets fit the figure's width (a character of the
    # "small" font is about 0.6 of its 8.3 points wide; a marker and the gaps about 36)
    column_pt = 0.6 * 8.3 * max(map(len, labels)) + 36
    fitting = max(1, int(72 * fig.get_figwidth() // column_pt))
    return fig.legend([handles[label] for label in labels], labels, loc="outside lower center",
                      ncols=min(columns, len(labels), fitting), frameon=False, fontsize="small")


#: how far (per RGB channel) a drawn colour may be from a method's and still be that method's
COLOUR_TOLERANCE = 1e-3


def _drawn_colours(ax) -> list[tuple[float, float, float]]:
    """The visible colours of what ``ax`` draws: lines and their markers (errorbar data
    lines and caps among them), scatter points, errorbar and filled bands, bar patches."""
    colours = []
    for line in ax.get_lines():
        colours += [line.get_color(), line.get_markerfacecolor(), line.get_markeredgecolor()]
    for collection in ax.collections:
        if isinstance(collection, (PathCollection, LineCollection, PolyCollection)):
            colours += list(collection.get_facecolor()) + list(collection.get_edgecolor())
    for patch in ax.patches:
        colours += [patch.get_facecolor(), patch.get_edgecolor()]
    return [rgba[:3] for rgba in map(to_rgba, colours) if rgba[3] > 0]     # "none" is transparent


def methods_missing_from_legend(fig) -> list[str]:
    """The methods ``fig`` draws in their colour (:func:`method_palette`, as
    :func:`method_style` gives it) that no legend of the figure names (a figure legend or a
    panel's; a label names the method it starts with, as in :func:`method_legend`), in the
    book's method order."""
    drawn = set()
    palette = method_palette()
    for ax in fig.axes:
        for colour in _drawn_colours(ax):
            drawn |= {method for method, rgb in palette.items()
                      if max(abs(a - b) for a, b in zip(colour, rgb)) <= COLOUR_TOLERANCE}
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    named = {_method_named(text.get_text()) for legend in legends for text in legend.get_texts()}
    return [method for method in method_order() if method in drawn and method not in named]


def require_method_legend(fig) -> None:
    """Raise a one-line :class:`~barter_mini.errors.BarterError` when ``fig`` draws a method
    its legends do not name (:func:`methods_missing_from_legend`): every book figure that
    draws methods ends with this, so such a figure fails the book build."""
    missing = methods_missing_from_legend(fig)
    if missing:
        title = next((ax.get_title() for ax in fig.axes if ax.get_title()), "")
        raise BarterError(f"the figure{f' {title!r}' if title else ''} draws {', '.join(missing)} in "
                          "its colour but no legend names it: label what draws it")
