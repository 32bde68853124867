"""Tables and figures for the notebooks: thin wrappers over pandas and seaborn."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import seaborn as sns

from ..core.barter import BarterSettings, TransferSchedule
from ..core.budgets import PAPER_TABLE3, compute_budget, initial_allocation
from ..core.models import get_model_config
from ..errors import BarterError
from .experiments import final_allocations
from .figures import stacked_panels
from .tables import column_words


def budget_table(densities=(0.1, 0.3, 0.5, 0.7), models=("cct-paper", "vit-paper", "cct-mini")) -> pd.DataFrame:
    """Our budgets and planned transfers beside Table 3 (blank where the paper has no entry)."""
    rows = []
    for name in models:
        config = get_model_config(name)
        for density in densities:
            budget = compute_budget(config, density)
            allocation = initial_allocation(config, budget)
            planned = TransferSchedule(1, budget, BarterSettings()).planned_totals()
            paper = PAPER_TABLE3.get((name, density), (None,) * 4)
            rows.append({
                "model": name, "density": density,
                "heads": budget.heads, "heads per layer": _span(allocation.heads),
                "FFN channels": budget.ffn, "FFN per layer": _span(allocation.ffn),
                "K_H": planned["heads"], "K_C": planned["ffn"],
                "Table 3 heads": paper[0], "Table 3 FFN": paper[1],
                "Table 3 K_H": paper[2], "Table 3 K_C": paper[3]})
    return pd.DataFrame(rows)


def _span(counts) -> str:
    low, high = min(counts), max(counts)
    return f"{low}" if low == high else f"{low}-{high}"


def readable(frame: pd.DataFrame, columns: Sequence[str] | dict, decimals: int | dict[str, int] = 2) -> pd.DataFrame:
    """The columns of ``frame`` a reader needs, under readable headers and rounded, to display
    on a page (write the full ``frame`` to the CSV file, not this).

    ``columns`` lists the columns to show, in the order shown: a sequence of column names
    (headed by their words in :data:`~barter_mini.book.tables.HEADERS`, as every table of the
    book is) or, for a header only one page uses, a dict from column to header. ``decimals``
    rounds every float column to that many decimals (an int) or only the columns named in
    a dict (keyed by ``frame``'s column names). A missing value (no number there) shows as
    a blank cell, and the rest of its column then as text with the same decimals. An
    unnamed index (row numbers) is renumbered from 0; a named one, such as a pivot
    table's ``method``, is kept.
    """
    if not isinstance(columns, dict):
        columns = {name: column_words(name) for name in columns}
    missing = [name for name in columns if name not in frame.columns]
    if missing:
        raise BarterError(f"no column {', '.join(map(repr, missing))} to show: the frame has "
                          f"{', '.join(map(str, frame.columns))}")
    shown = frame[list(columns)].copy()
    floats = [name for name in columns if pd.api.types.is_float_dtype(shown[name])]
    rounding = ({name: decimals for name in floats} if not isinstance(decimals, dict)
                else {name: places for name, places in decimals.items() if name in columns})
    shown = shown.round(rounding)
    for name in floats:
        if shown[name].isna().any():
            places = rounding.get(name)
            shown[name] = ["" if pd.isna(v) else f"{v:.{places}f}" if places is not None else f"{v:g}"
                           for v in shown[name]]
    if frame.index.names == [None]:
        shown = shown.reset_index(drop=True)
    return shown.rename(columns=columns)


# The table below lists column names only: their headers are the words of
# barter_mini.book.tables.HEADERS, so a column reads the same in every table of the book.

#: the from-scratch runs on the page (the CSV keeps validation scores and FFN channels)
RUN_COLUMNS = ("method", "density", "seed", "acc", "f1", "wall_time_s", "params", "heads")


def _integer_ticks(frame: pd.DataFrame) -> list[int]:
    """At most six whole-number colour-bar ticks over ``frame``'s range (a count has no
    fractions)."""
    low, high = int(frame.min().min()), int(frame.max().max())
    step = max(1, int(np.ceil((high - low) / 5)))
    return list(range(low, high + 1, step))


def plot_final_allocations(runs: pd.DataFrame):
    """Heads and FFN channels per layer that each run ends with (rows: runs)."""
    fig, axes = stacked_panels(2, 0.3 * len(runs) + 1.2)
    for ax, kind, label in zip(axes, ("heads", "ffn"), ("attention heads", "FFN channels")):
        frame = final_allocations(runs, kind)
        sns.heatmap(frame, ax=ax, cmap="viridis", annot=True, fmt="d", annot_kws={"fontsize": 8},
                    cbar_kws={"label": f"{label} per layer", "ticks": _integer_ticks(frame)})
        ax.set_xlabel("layer")
        ax.set_ylabel("run")
        ax.set_title(f"final {label} per layer")
    return fig
