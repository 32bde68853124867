"""Tables and figures for the notebooks: thin wrappers over pandas and seaborn."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from .barter import BarterSettings, TransferSchedule
from .budgets import PAPER_TABLE3, compute_budget, initial_allocation
from .configs import get_model_config


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
