"""Tables and figures for the notebooks: thin wrappers over pandas and seaborn."""

from __future__ import annotations

import colorsys
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.colors import to_rgba

from ..core.barter import BarterSettings, TransferSchedule
from ..core.budgets import PAPER_TABLE3, compute_budget, initial_allocation
from ..core.models import get_model_config
from ..errors import BarterError
from .experiments import final_allocations
from .figures import MAX_WIDTH_IN, stacked_panels
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


# The tables below list column names only: their headers are the words of
# barter_mini.book.tables.HEADERS, so a column reads the same in every table of the book.

#: the from-scratch runs on the page (the CSV keeps validation scores and FFN channels)
RUN_COLUMNS = ("method", "density", "seed", "acc", "f1", "wall_time_s", "params", "heads")
#: compute and size beside the paper (from :func:`~barter_mini.book.efficiency.compute_beside_paper`)
COMPUTE_COLUMNS = ("model", "method", "density", "train_gflops_per_image", "paper_train_gflops_per_image",
                   "params_m", "paper_params_m", "counted_train_gflops_per_image")
#: BARTER against RigL per density (from :func:`barter_mini.measure.bench_report.ratios`)
RATIO_COLUMNS = ("density", "speedup", "ideal_speedup", "efficiency", "epoch_speedup", "memory_fraction",
                 "update_percent_of_training")
#: BARTER's fixed work and the efficiency without it (from :func:`barter_mini.measure.bench_report.fixed_work`)
FIXED_WORK_COLUMNS = ("model", "density", "efficiency", "fixed_ms", "fixed_share", "rigl_fixed_ms",
                      "efficiency_without_fixed")
#: an execution against eager (from :func:`barter_mini.measure.bench_report.execution_effects`)
EXECUTION_COLUMNS = ("model", "method", "density", "execution", "step_speedup", "memory_fraction",
                     "compile_s", "compile_s_per_schedule")
#: BARTER against RigL under each execution (a narrower :data:`RATIO_COLUMNS`)
EXECUTION_RATIO_COLUMNS = ("model", "execution", "density", "speedup", "ideal_speedup", "efficiency",
                           "memory_fraction")
#: the topology updates' cost per method and density (bench rows)
UPDATE_COST_COLUMNS = ("method", "density", "update_ms", "updates_per_schedule", "update_s_per_schedule",
                       "update_ms_per_step", "update_percent_of_training")
#: decimals of the update-cost table: BARTER's per-step costs are hundredths of a millisecond
UPDATE_COST_DECIMALS = {"update_ms": 2, "update_s_per_schedule": 3, "update_ms_per_step": 4,
                        "update_percent_of_training": 4}
#: the paper's Tables 16 and 17 (transfer multiplier and update cost, ViT)
TRANSFER_COST_COLUMNS = ("multiplier", "head_transfers", "ffn_transfers", "update_ms_per_step",
                         "update_s_per_schedule")
#: Figure 1's points (from :func:`~barter_mini.book.experiments.accuracy_beside_step_time`)
STEP_TIME_COLUMNS = ("method", "density", "step_ms", "acc", "runs")


def plot_training_curves(metrics: dict, ax=None):
    """Running training accuracy per step and validation accuracy per epoch (percent)."""
    ax = ax or plt.subplots(figsize=(MAX_WIDTH_IN, 3.5), constrained_layout=True)[1]
    curve = pd.DataFrame(metrics["curve"])
    history = pd.DataFrame(metrics["history"])
    if not curve.empty:
        ax.plot(curve["step"], 100 * curve["train_acc"], label="training batches (running)")
    ax.plot(history["step"], 100 * history["val_acc"], "o-", label="validation (end of epoch)")
    updates = [h["step"] for h in metrics.get("allocation_history", [])[1:]]
    for i, step in enumerate(updates):
        ax.axvline(step, color="grey", alpha=0.25, lw=0.8, label="topology update" if i == 0 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("Top-1 accuracy (%)")
    ax.set_title(f"{metrics['method']} {metrics['model']} at density {metrics['density']:g} on {metrics['dataset']}")
    ax.legend(loc="lower right")
    return ax


def allocation_frame(metrics: dict, kind: str) -> pd.DataFrame:
    """Units of ``kind`` ("heads" or "ffn") per layer (rows) after each update (columns: step)."""
    history = metrics["allocation_history"]
    return pd.DataFrame(np.array([h[kind] for h in history]).T,
                        columns=[h["step"] for h in history],
                        index=pd.Index(range(len(history[0][kind])), name="layer"))


def plot_allocation_heatmaps(metrics: dict):
    """Heads and FFN channels per layer over training, one full-width heatmap each (one above
    the other), every cell annotated with its count while the columns leave room for it."""
    frames = {kind: allocation_frame(metrics, kind) for kind in ("heads", "ffn")}
    updates = frames["heads"].shape[1]
    fig, axes = stacked_panels(2, 0.4 * frames["heads"].shape[0] + 1.3)
    for ax, (kind, frame), label in zip(axes, frames.items(), ("attention heads", "FFN channels")):
        # a count is written in its cell while the cells are wide enough for it at 8 pt
        annotate = updates <= (24 if kind == "heads" else 16)
        sns.heatmap(frame, ax=ax, cmap="viridis", annot=annotate, fmt="d", annot_kws={"fontsize": 8},
                    cbar_kws={"label": f"{label} per layer", "pad": 0.01, "ticks": _integer_ticks(frame)})
        ax.set_xlabel("optimizer step of the update (0 = initial allocation)")
        ax.set_ylabel("layer")
        ax.set_title(f"{label}: budget {int(frame.iloc[:, 0].sum())}, fixed")
        if updates > 10:
            ticks = np.linspace(0, updates - 1, 8).astype(int)
            ax.set_xticks(ticks + 0.5, [frame.columns[t] for t in ticks], rotation=0)
    return fig


def _integer_ticks(frame: pd.DataFrame) -> list[int]:
    """At most six whole-number colour-bar ticks over ``frame``'s range (a count has no
    fractions)."""
    low, high = int(frame.min().min()), int(frame.max().max())
    step = max(1, int(np.ceil((high - low) / 5)))
    return list(range(low, high + 1, step))


#: the book's methods, in the order of its tables and legends
METHOD_ORDER = ("dense", "set", "snfs", "rigl", "srigl", "s2vite", "static", "oneshot",
                "random-receiver", "random-donor", "random-pair", "barter")
#: BARTER's colour: a fully saturated dark red, alone in its part of the hue circle and, for
#: readers with any of the three colour-vision deficiencies, further from every other method
#: than the book's tests require (simulated with colorspacious)
BARTER_COLOR = (0.75, 0.0, 0.0)
#: dense, the full-density reference, is the one grey
DENSE_COLOR = (0.3, 0.3, 0.3)
#: hue (degrees) kept clear on either side of BARTER's red
BARTER_HUE_GAP = 45.0
#: (method, HLS lightness, HLS saturation) of the other methods, in hue order from
#: BARTER_HUE_GAP to 360 - BARTER_HUE_GAP. Lightness alternates so that neighbours differ,
#: and the order was searched so that no method looks like BARTER under protanomaly,
#: deuteranomaly or tritanomaly (the red-green pairs of the first palette did).
_HUE_CIRCLE = (("random-receiver", 0.70, 0.60), ("set", 0.48, 0.65), ("random-donor", 0.55, 0.60),
               ("oneshot", 0.70, 0.80), ("random-pair", 0.32, 0.65), ("rigl", 0.45, 0.50),
               ("s2vite", 0.42, 0.60), ("srigl", 0.28, 0.65), ("static", 0.45, 0.80),
               ("snfs", 0.32, 0.55))
#: one marker per method, so that no figure depends on colour alone: BARTER the large star
METHOD_MARKERS = {"dense": "o", "set": "v", "snfs": "<", "rigl": "^", "srigl": ">", "s2vite": "P",
                  "static": "s", "oneshot": "X", "random-receiver": "d", "random-donor": "h",
                  "random-pair": "p", "barter": "*"}


def _method_palette() -> dict[str, tuple[float, float, float]]:
    """One RGB colour per method of :data:`METHOD_ORDER`.

    BARTER is a fully saturated red; every other method but dense gets its own hue, evenly
    spaced over the rest of the circle (270 / 9 = 30 degrees apart), so no two methods
    share a hue and BARTER's nearest neighbour is further from it (45 degrees) than any
    other method's. Dense, a reference line, is grey. Each method also has its own marker
    (:data:`METHOD_MARKERS`), so no figure relies on colour alone.
    """
    span = 360.0 - 2 * BARTER_HUE_GAP
    step = span / (len(_HUE_CIRCLE) - 1)
    palette = {"dense": DENSE_COLOR, "barter": BARTER_COLOR}
    for i, (method, lightness, saturation) in enumerate(_HUE_CIRCLE):
        hue = (BARTER_HUE_GAP + i * step) / 360.0
        palette[method] = tuple(float(c) for c in colorsys.hls_to_rgb(hue, lightness, saturation))
    return {method: palette[method] for method in METHOD_ORDER}


#: one colour per method, shared by every figure of the book: BARTER pure red, 45 degrees of
#: hue clear on either side; the others 30 degrees apart over the rest of the circle;
#: dense grey
METHOD_PALETTE = _method_palette()


def method_style(method: str) -> dict:
    """Colour, marker and size of ``method``'s points and lines: BARTER drawn larger and on top."""
    barter = method == "barter"
    return {"color": METHOD_PALETTE[method], "marker": METHOD_MARKERS[method], "ms": 11 if barter else 6,
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
        return (1, METHOD_ORDER.index(method)) if method in METHOD_ORDER else (2, 0)
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
    """The methods ``fig`` draws in their colour (:data:`METHOD_PALETTE`, as
    :func:`method_style` gives it) that no legend of the figure names (a figure legend or a
    panel's; a label names the method it starts with, as in :func:`method_legend`), in the
    book's method order."""
    drawn = set()
    for ax in fig.axes:
        for colour in _drawn_colours(ax):
            drawn |= {method for method, rgb in METHOD_PALETTE.items()
                      if max(abs(a - b) for a, b in zip(colour, rgb)) <= COLOUR_TOLERANCE}
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    named = {_method_named(text.get_text()) for legend in legends for text in legend.get_texts()}
    return [method for method in METHOD_ORDER if method in drawn and method not in named]


def require_method_legend(fig) -> None:
    """Raise a one-line :class:`~barter_mini.errors.BarterError` when ``fig`` draws a method
    its legends do not name (:func:`methods_missing_from_legend`): every book figure that
    draws methods ends with this, so such a figure fails the book build."""
    missing = methods_missing_from_legend(fig)
    if missing:
        title = next((ax.get_title() for ax in fig.axes if ax.get_title()), "")
        raise BarterError(f"the figure{f' {title!r}' if title else ''} draws {', '.join(missing)} in "
                          "its colour but no legend names it: label what draws it")


def _rows_per_method(frame: pd.DataFrame, sort_by: str, among=None):
    """``(method, rows sorted by sort_by)`` in the book's method order, for the methods in
    ``frame`` (and in ``among``, when given)."""
    present = set(frame["method"]) & (set(among) if among is not None else set(METHOD_ORDER))
    for method in (m for m in METHOD_ORDER if m in present):
        yield method, frame[frame["method"] == method].sort_values(sort_by)


def plot_accuracy_against_density(summary: pd.DataFrame, paper: pd.DataFrame | None = None,
                                  paper_title: str = "paper, CCT on CIFAR-100", live: pd.DataFrame | None = None,
                                  title: str = "this run"):
    """Table 1 (or Figure 5 (a)) as a figure: test Top-1 (%) against density, one line per
    method, sample-std error bars; dense as a horizontal reference. With ``paper``, a second
    panel (``paper_title``) shows the paper's numbers on the same layout, so orderings can be
    compared. With ``live`` (another summary: the build's own runs beside a recorded
    ``summary``), its means are drawn as hollow markers in the first panel, named once in
    the legend."""
    panels = [(title, summary)] + ([(paper_title, paper)] if paper is not None else [])
    fig, axes = stacked_panels(len(panels), 3.0, legend_in=0.8, sharex=True)
    for ax, (name, table) in zip(axes, panels):
        for method, rows in _rows_per_method(table, "density", among=summary["method"]):
            color = METHOD_PALETTE[method]
            if method == "dense":
                ax.axhline(rows["acc_mean"].iloc[0], color=color, ls="--", label="dense (rho = 1)")
                continue
            ax.errorbar(rows["density"], rows["acc_mean"], yerr=rows["acc_std"].fillna(0), capsize=3,
                        label=method, **method_style(method))
        ax.set_ylabel("test Top-1 (%)")
        ax.set_title(name)
    if live is not None:
        for method, rows in _rows_per_method(live, "density"):
            named = method in set(summary["method"])
            style = {**method_style(method), "ms": 9, "mfc": "white", "mew": 1.5, "zorder": 4}
            axes[0].plot(rows["density"], rows["acc_mean"], linestyle="none",
                         label=None if named else f"{method}, this build", **style)
        axes[0].plot([], [], "o", mfc="white", mec="0.3", mew=1.5, label="hollow: this build's own runs")
    axes[-1].set_xlabel("density rho (fraction of heads and FFN channels, or of weights)")
    method_legend(fig)
    require_method_legend(fig)
    return fig


def plot_ablation_differences(differences: pd.DataFrame, reference: str = "barter"):
    """Figure 6: bars of each variant's Top-1 and macro-F1 minus BARTER's, in points, with the
    variant's own score (%) in parentheses."""
    long = pd.concat([
        pd.DataFrame({"variant": differences["method"], "metric": "Top-1", "difference": differences["acc_diff"],
                      "score": differences["acc"]}),
        pd.DataFrame({"variant": differences["method"], "metric": "macro-F1", "difference": differences["f1_diff"],
                      "score": differences["f1"]})])
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN, 3.6), constrained_layout=True)
    sns.barplot(long, x="variant", y="difference", hue="metric", ax=ax, palette=sns.color_palette("colorblind", 2))
    for container, metric in zip(ax.containers, ("Top-1", "macro-F1")):
        scores = long[long["metric"] == metric]["score"]
        ax.bar_label(container, labels=[f"{d:+.2f}\n({s:.1f})" for d, s in
                                        zip(long[long["metric"] == metric]["difference"], scores)],
                     fontsize="small", padding=2)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("variant")
    ax.set_ylabel(f"variant minus {reference} (percentage points)")
    ax.margins(y=0.3)
    require_method_legend(fig)
    return fig


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


def by_density(rows, value: str, methods=METHOD_ORDER) -> pd.DataFrame:
    """``value`` per method (rows) and density (columns); dense, trained only at rho = 1, is
    repeated across the columns as in the paper's Tables 6-9."""
    frame = pd.DataFrame(rows)
    sparse = frame[frame["method"] != "dense"]
    table = sparse.pivot(index="method", columns="density", values=value)
    if (frame["method"] == "dense").any():
        dense_value = frame.loc[frame["method"] == "dense", value].iloc[0]
        table.loc["dense"] = dense_value
    order = [m for m in methods if m in table.index]
    table = table.loc[order]
    table.columns = pd.Index(table.columns, name="density")
    return table


def plot_compute_and_size(rows_by_model: dict):
    """Figure 4: training GFLOPs per image (3 x forward, as executed) against exported
    parameters, one panel per model; each method's points run over the densities."""
    fig, axes = stacked_panels(len(rows_by_model), 3.2, legend_in=0.8)
    for ax, (model, rows) in zip(axes, rows_by_model.items()):
        frame = pd.DataFrame(rows)
        for method, points in _rows_per_method(frame, "density"):
            style = method_style(method)
            if method == "dense":
                style["ms"] = 12
            ax.plot(points["params"] / 1e6, points["train_gflops_per_image"], label=method, alpha=0.8,
                    **style)
        # methods whose points coincide (the masked ones execute and export the dense model)
        # would hide behind each other: name them beside the shared point
        shared = frame.assign(x=(frame["params"] / 1e6).round(6), y=frame["train_gflops_per_image"].round(6))
        for (x, y), at in shared.groupby(["x", "y"]):
            names = [m for m in METHOD_ORDER if m in set(at["method"])]
            if len(names) > 1:
                ax.annotate(", ".join(names), (x, y), textcoords="offset points", xytext=(-8, -14), ha="right",
                            fontsize="small")
        ax.set_xlabel("exported parameters (millions)")
        ax.set_ylabel("training GFLOPs per image (3 x forward)")
        ax.set_title(model)
    method_legend(fig)
    require_method_legend(fig)
    return fig


def plot_cost_against_density(rows_by_model: dict, where: str = ""):
    """Figure 7 and Figure 3 (right): median step time (left) and peak training memory
    (right) against density, one row of panels per model (``{model: bench rows}``), one line
    per method; dense as a horizontal reference. ``where`` (the device) goes in the titles."""
    fig, axes = plt.subplots(len(rows_by_model), 2, figsize=(MAX_WIDTH_IN, 2.9 * len(rows_by_model) + 0.8),
                             constrained_layout=True, squeeze=False, sharex=True)
    for row, (model, rows) in zip(axes, rows_by_model.items()):
        frame = pd.DataFrame(rows)
        for ax, value, label in zip(row, ("step_ms", "peak_mem_mb"), ("step time (ms)", "peak memory (MB)")):
            for method, points in _rows_per_method(frame, "density"):
                color = METHOD_PALETTE[method]
                if method == "dense":
                    ax.axhline(points[value].iloc[0], color=color, ls="--", label="dense (rho = 1)")
                else:
                    ax.plot(points["density"], points[value], "-", label=method, **method_style(method))
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{model}{f' on {where}' if where else ''}: {label.split(' (')[0]}")
    for ax in axes[-1]:
        ax.set_xlabel("density rho")
    method_legend(fig, columns=5)
    require_method_legend(fig)
    return fig


def plot_accuracy_against_step_time(points: pd.DataFrame):
    """Figure 1: test Top-1 against median step time, one line per method, labelled with
    the density; points without a trained run are left out."""
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN, 4.2), constrained_layout=True)
    points = points.dropna(subset=["acc"])
    if points.empty:  # the page still shows where the figure goes, and why it is empty
        ax.text(0.5, 0.5, "no from-scratch run at these settings yet:\nrun chapter 02 first", ha="center",
                va="center", transform=ax.transAxes)
    for method, rows in _rows_per_method(points, "step_ms"):
        ax.plot(rows["step_ms"], rows["acc"], "-", label=method, **method_style(method))
        for _, row in rows.iterrows():
            ax.annotate(f"{row['density']:g}", (row["step_ms"], row["acc"]), textcoords="offset points",
                        xytext=(4, 4), fontsize="small")
    ax.set_xlabel("median training step time (ms)")
    ax.set_ylabel("test Top-1 accuracy (%)")
    method_legend(fig, columns=4)
    require_method_legend(fig)
    return fig


#: the profile's categories, bottom to top: what shrinks with the density, then what does not
PROFILE_CATEGORIES = ("matmul", "attention", "layernorm", "stem", "elementwise", "optimizer", "method", "other")


def plot_efficiency(ratios: pd.DataFrame, paper_gap: float = 0.85):
    """BARTER's measured speedup over RigL as a share of the FLOPs-ideal one, against density:
    one line per model and execution (``ratios``: :func:`~barter_mini.measure.bench_report.ratios`
    rows with a ``model`` column), the issue's target as a dotted line."""
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN, 4), constrained_layout=True)
    frame = ratios.assign(execution=ratios.get("execution", "eager"))
    for (model, execution), points in frame.groupby(["model", "execution"], sort=False):
        points = points.sort_values("density")
        ax.plot(points["density"], points["efficiency"], "o-" if execution == "eager" else "s--",
                label=f"{model}, {execution}")
    ax.axhline(1.0, color=DENSE_COLOR, lw=0.8)
    ax.axhline(paper_gap, color=DENSE_COLOR, ls=":", lw=0.8, label=f"{paper_gap:g} of the ideal")
    ax.set_xlabel("density rho")
    ax.set_ylabel("speedup over RigL / FLOPs-ideal speedup")
    ax.set_ylim(0, 1.15)
    ax.legend(fontsize="small")
    return fig


def plot_step_profile(rows_by_model: dict, methods=("rigl", "barter"), where: str = ""):
    """Where a step's time goes (``profile_CATEGORY_ms`` of bench rows run with
    ``profile_steps``): stacked bars of ms per step for each method at each density, one
    panel per model (``{model: bench rows}``, eager rows); the products and attention shrink
    with the density, the fixed width-D work does not."""
    frames = {model: _profiled(rows, methods) for model, rows in rows_by_model.items()}
    fig, axes = stacked_panels(len(frames), 3.2, legend_in=0.7)
    colors = sns.color_palette("colorblind", len(PROFILE_CATEGORIES))
    for ax, (model, frame) in zip(axes, frames.items()):
        frame.plot.bar(stacked=True, ax=ax, color=colors, width=0.75, legend=False)
        ax.set_xlabel("")
        ax.set_ylabel("ms per step (profiled)")
        ax.set_title(f"{model}: where a step's time goes{f' ({where})' if where else ''}")
        ax.tick_params(axis="x", labelrotation=0, labelsize=7.5)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", frameon=False,
               ncols=len(PROFILE_CATEGORIES) // 2, title="kind of work")  # below the bars, never over them
    return fig


def _profiled(rows, methods) -> pd.DataFrame:
    """ms per step of each profile category (columns) per method and density (rows)."""
    frame = pd.DataFrame(rows)
    frame = frame[frame["method"].isin(methods) & frame.get("execution", pd.Series("eager", frame.index)).eq("eager")]
    columns = [f"profile_{c}_ms" for c in PROFILE_CATEGORIES]
    if frame.empty or columns[0] not in frame:
        raise BarterError("no profiled rows of " + ", ".join(methods) + ": run the bench with profile_steps > 0")
    frame = frame.assign(case=[f"{m}\nrho {d:g}" for m, d in zip(frame["method"], frame["density"])])
    frame = frame.sort_values(["density", "method"]).set_index("case")[columns]
    frame.columns = list(PROFILE_CATEGORIES)
    return frame
