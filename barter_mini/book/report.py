"""Tables and figures for the notebooks: thin wrappers over pandas and seaborn."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ..core.barter import BarterSettings, TransferSchedule
from ..core.budgets import PAPER_TABLE3, compute_budget, initial_allocation
from ..core.models import get_model_config
from ..errors import BarterError
from .experiments import final_allocations
from .figures import MAX_WIDTH_IN, stacked_panels
from .palette import DENSE_COLOR, METHOD_ORDER, METHOD_PALETTE, method_legend, method_style, require_method_legend
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
STEP_TIME_COLUMNS = ("method", "density", "step_ms", "acc", "runs", "source")


def _integer_ticks(frame: pd.DataFrame) -> list[int]:
    """At most six whole-number colour-bar ticks over ``frame``'s range (a count has no
    fractions)."""
    low, high = int(frame.min().min()), int(frame.max().max())
    step = max(1, int(np.ceil((high - low) / 5)))
    return list(range(low, high + 1, step))


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


#: Figure 1 labels the densities of the pair its caption compares (and dense's one point);
#: the other methods' labels would pile up where the masked methods share one step time.
#: Each labelled method's text sits on its own side of its points (offset in points).
STEP_TIME_LABELS = {"barter": (-6, 6), "rigl": (6, -10), "dense": (6, 4)}


def plot_accuracy_against_step_time(points: pd.DataFrame):
    """Figure 1: test Top-1 against median step time, one line per method; the points of
    :data:`STEP_TIME_LABELS`' methods labelled with their density; points without a trained
    run are left out."""
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN, 4.2), constrained_layout=True)
    points = points.dropna(subset=["acc"])
    if points.empty:  # the page still shows where the figure goes, and why it is empty
        ax.text(0.5, 0.5, "no from-scratch run at these settings yet:\nrun chapter 02 first", ha="center",
                va="center", transform=ax.transAxes)
    for method, rows in _rows_per_method(points, "step_ms"):
        ax.plot(rows["step_ms"], rows["acc"], "-", label=method, **method_style(method))
        if method not in STEP_TIME_LABELS:
            continue
        offset = STEP_TIME_LABELS[method]
        for _, row in rows.iterrows():
            ax.annotate(f"{row['density']:g}", (row["step_ms"], row["acc"]), textcoords="offset points",
                        xytext=offset, ha="right" if offset[0] < 0 else "left", fontsize="small",
                        color=method_style(method)["color"])
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
