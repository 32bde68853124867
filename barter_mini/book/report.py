"""Tables and figures for the notebooks: thin wrappers over pandas and seaborn."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ..core.barter import BarterSettings, TransferSchedule
from ..core.budgets import PAPER_TABLE3, compute_budget, initial_allocation
from ..core.configs import get_model_config
from .experiments import final_allocations


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


def plot_training_curves(metrics: dict, ax=None):
    """Running training accuracy per step and validation accuracy per epoch (percent)."""
    ax = ax or plt.subplots(figsize=(7, 3.5))[1]
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
    """Heads and FFN channels per layer over training, one heatmap each."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.2), constrained_layout=True)
    for ax, kind, label in zip(axes, ("heads", "ffn"), ("attention heads", "FFN channels")):
        frame = allocation_frame(metrics, kind)
        sns.heatmap(frame, ax=ax, cmap="viridis", annot=frame.shape[1] <= 12 and kind == "heads",
                    fmt="d", cbar_kws={"label": f"{label} per layer"})
        ax.set_xlabel("optimizer step of the update (0 = initial allocation)")
        ax.set_ylabel("layer")
        ax.set_title(f"{label}: budget {int(frame.iloc[:, 0].sum())}, fixed")
        if frame.shape[1] > 12:
            ticks = np.linspace(0, frame.shape[1] - 1, 8).astype(int)
            ax.set_xticks(ticks + 0.5, [frame.columns[t] for t in ticks], rotation=0)
    return fig


#: one colour per method, shared by every figure of the book
METHOD_ORDER = ("dense", "set", "snfs", "rigl", "srigl", "s2vite", "static",
                "random-receiver", "random-donor", "random-pair", "barter")
METHOD_PALETTE = dict(zip(METHOD_ORDER, sns.color_palette("tab10", 10) + [(0.85, 0.37, 0.0)]))


def _rows_per_method(frame: pd.DataFrame, sort_by: str, among=None):
    """``(method, rows sorted by sort_by)`` in the book's method order, for the methods in
    ``frame`` (and in ``among``, when given)."""
    present = set(frame["method"]) & (set(among) if among is not None else set(METHOD_ORDER))
    for method in (m for m in METHOD_ORDER if m in present):
        yield method, frame[frame["method"] == method].sort_values(sort_by)


def plot_accuracy_against_density(summary: pd.DataFrame, paper: pd.DataFrame | None = None):
    """Table 1 as a figure: test Top-1 (%) against density, one line per method, sample-std
    error bars; dense as a horizontal reference. With ``paper``, a second panel shows the
    paper's CCT/CIFAR-100 numbers on the same layout, so orderings can be compared."""
    panels = [("this run", summary)] + ([("paper, CCT on CIFAR-100", paper)] if paper is not None else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 3.8), constrained_layout=True,
                             squeeze=False)
    for ax, (title, table) in zip(axes[0], panels):
        for method, rows in _rows_per_method(table, "density", among=summary["method"]):
            color = METHOD_PALETTE[method]
            if method == "dense":
                ax.axhline(rows["acc_mean"].iloc[0], color=color, ls="--", label="dense (rho = 1)")
                continue
            ax.errorbar(rows["density"], rows["acc_mean"], yerr=rows["acc_std"].fillna(0), marker="o",
                        capsize=3, color=color, label=method)
        ax.set_xlabel("density rho (fraction of heads and FFN channels, or of weights)")
        ax.set_ylabel("test Top-1 accuracy (%)")
        ax.set_title(title)
    axes[0][-1].legend(fontsize="small", loc="lower right")
    return fig


def plot_ablation_differences(differences: pd.DataFrame, reference: str = "barter"):
    """Figure 6: bars of each variant's Top-1 and macro-F1 minus BARTER's, in points, with the
    variant's own score (%) in parentheses."""
    long = pd.concat([
        pd.DataFrame({"variant": differences["method"], "metric": "Top-1", "difference": differences["acc_diff"],
                      "score": differences["acc"]}),
        pd.DataFrame({"variant": differences["method"], "metric": "macro-F1", "difference": differences["f1_diff"],
                      "score": differences["f1"]})])
    fig, ax = plt.subplots(figsize=(7.5, 3.6), constrained_layout=True)
    sns.barplot(long, x="variant", y="difference", hue="metric", ax=ax)
    for container, metric in zip(ax.containers, ("Top-1", "macro-F1")):
        scores = long[long["metric"] == metric]["score"]
        ax.bar_label(container, labels=[f"{d:+.2f}\n({s:.1f})" for d, s in
                                        zip(long[long["metric"] == metric]["difference"], scores)],
                     fontsize="x-small", padding=2)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("variant")
    ax.set_ylabel(f"variant minus {reference} (percentage points)")
    ax.margins(y=0.3)
    return fig


def plot_final_allocations(runs: pd.DataFrame):
    """Heads and FFN channels per layer that each run ends with (rows: runs)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.45 * len(runs) + 1.6), constrained_layout=True)
    for ax, kind, label in zip(axes, ("heads", "ffn"), ("attention heads", "FFN channels")):
        frame = final_allocations(runs, kind)
        sns.heatmap(frame, ax=ax, cmap="viridis", annot=True, fmt="d", cbar_kws={"label": f"{label} per layer"})
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
    fig, axes = plt.subplots(1, len(rows_by_model), figsize=(6.2 * len(rows_by_model), 4),
                             constrained_layout=True, squeeze=False)
    for ax, (model, rows) in zip(axes[0], rows_by_model.items()):
        frame = pd.DataFrame(rows)
        for method, points in _rows_per_method(frame, "density"):
            marker = "*" if method == "dense" else "o"
            ax.plot(points["params"] / 1e6, points["train_gflops_per_image"], marker=marker,
                    ms=14 if method == "dense" else 6, color=METHOD_PALETTE[method], label=method,
                    alpha=0.8)
        ax.set_xlabel("exported parameters (millions)")
        ax.set_ylabel("training GFLOPs per image (3 x forward)")
        ax.set_title(model)
        ax.legend(fontsize="small")
    return fig


def plot_cost_against_density(rows, title: str = ""):
    """Figure 7 and Figure 3 (right): median step time and peak training memory against
    density, one line per method; dense as a horizontal reference."""
    frame = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), constrained_layout=True)
    for ax, value, label in zip(axes, ("step_ms", "peak_mem_mb"),
                                ("median step time (ms)", "peak training memory (MB)")):
        for method, points in _rows_per_method(frame, "density"):
            color = METHOD_PALETTE[method]
            if method == "dense":
                ax.axhline(points[value].iloc[0], color=color, ls="--", label="dense (rho = 1)")
            else:
                ax.plot(points["density"], points[value], "o-", color=color, label=method)
        ax.set_xlabel("density rho")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{title}: {label}" if title else label)
    axes[1].legend(fontsize="small")
    return fig


def plot_accuracy_against_step_time(points: pd.DataFrame):
    """Figure 1: test Top-1 against median step time, one line per method, labelled with
    the density; points without a trained run are left out."""
    fig, ax = plt.subplots(figsize=(7, 4.2), constrained_layout=True)
    points = points.dropna(subset=["acc"])
    for method, rows in _rows_per_method(points, "step_ms"):
        ax.plot(rows["step_ms"], rows["acc"], "o-", color=METHOD_PALETTE[method], label=method)
        for _, row in rows.iterrows():
            ax.annotate(f"{row['density']:g}", (row["step_ms"], row["acc"]), textcoords="offset points",
                        xytext=(4, 4), fontsize="x-small")
    ax.set_xlabel("median training step time (ms)")
    ax.set_ylabel("test Top-1 accuracy (%)")
    ax.legend(fontsize="small")
    return fig
