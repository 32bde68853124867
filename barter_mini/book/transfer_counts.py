"""How many units to move: BARTER at 1x, 2x, 4x and 6x the paper's transfers (Tables 16, 17).

Table 3 fixes how many heads and FFN channels BARTER moves over a schedule (``K_H``, ``K_C``);
Table 16 trains ViT/Tiny-ImageNet at rho = 0.5 with that count multiplied, and Table 17
gives what the extra updates cost. Here each multiplier is a BARTER run of the profile
(``RunConfig.transfer_multiplier`` scales the paper's count, whatever the profile's recipe
uses), with its planned and executed transfers, Top-1 and macro-F1, and the wall time its
topology updates took inside the run (``update_time_s`` in metrics.json: every
``after_step`` that changed the model, so the statistics' bookkeeping between updates is
not in it), per training step and over the schedule.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
from tqdm import tqdm

from ..errors import BarterError, check_in_range, check_list
from ..training.cache import cached_train
from ..training.run_config import RunConfig
from .experiments import mean_std, paired_by_seed, profile_run, read_paper_table
from .figures import plain_log_labels, stacked_panels
from .seed_noise import RULE, beyond_noise
from .profiles import Profile
from .palette import BARTER_COLOR, require_method_legend
from .tables import count_noun, signed

def multiplier_run(setup: Profile, multiplier: float, density: float, seed: int) -> RunConfig:
    """The profile's BARTER run with the paper's transfer counts times ``multiplier``."""
    return replace(profile_run(setup, "barter", density, seed), transfer_multiplier=float(multiplier))


def check_multipliers(multipliers) -> list[float]:
    """The multipliers as floats, each positive; at least one."""
    multipliers = [check_in_range("multiplier", m, 0.0, float("inf"), low_open=True)
                   for m in check_list("multipliers", multipliers, "positive numbers", allow_empty=True)]
    if not multipliers:
        raise BarterError("multipliers must list at least one positive number")
    return multipliers


def run_multipliers(setup: Profile, multipliers, density: float, seeds, progress: bool = True) -> pd.DataFrame:
    """One BARTER run per multiplier and seed; one row each: planned and executed head and
    FFN transfers, validation and test Top-1 and test macro-F1 (%), update time (ms per
    training step, s per schedule)."""
    multipliers = check_multipliers(multipliers)
    rows = []
    for multiplier, seed in tqdm([(m, s) for m in multipliers for s in seeds], desc="runs", disable=not progress):
        metrics = cached_train(multiplier_run(setup, multiplier, density, seed))
        planned, executed = metrics["transfers_planned"], metrics["transfers_executed"]
        rows.append({"multiplier": multiplier, "seed": seed, "heads_planned": planned["heads"],
                     "ffn_planned": planned["ffn"], "head_transfers": executed["heads"],
                     "ffn_transfers": executed["ffn"], "val_acc": 100 * metrics["val_acc"],
                     "acc": 100 * metrics["test_acc"], "f1": 100 * metrics["test_macro_f1"],
                     "update_ms_per_step": metrics["update_ms_per_step"],
                     "update_s_per_schedule": metrics["update_time_s"]})
    return pd.DataFrame(rows)


def runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`run_multipliers`' rows narrowed to a page's width: moved / planned per unit kind
    in one column each, validation and test Top-1, test macro-F1, update ms per step (the
    seconds per schedule and the unrounded values stay in the notebook's CSV)."""
    return pd.DataFrame({
        "multiplier": runs["multiplier"], "seed": runs["seed"],
        "heads moved / planned": [f"{m} / {p}" for m, p in zip(runs["head_transfers"], runs["heads_planned"])],
        "FFN moved / planned": [f"{m} / {p}" for m, p in zip(runs["ffn_transfers"], runs["ffn_planned"])],
        "val_acc": runs["val_acc"].round(2), "acc": runs["acc"].round(2), "f1": runs["f1"].round(2),
        "update_ms_per_step": runs["update_ms_per_step"].round(3),
    })


def _paper_multipliers() -> pd.DataFrame:
    """Tables 16 and 17 (ViT/Tiny-ImageNet, rho = 0.5), indexed by multiplier."""
    return read_paper_table("table16_17_transfer_multiplier_vit").set_index("multiplier")


def multipliers_beside_paper(runs: pd.DataFrame) -> pd.DataFrame:
    """Tables 16 and 17 layout, ours (mean ± sample std over seeds) beside the paper's
    (ViT/Tiny-ImageNet, rho = 0.5)."""
    paper = _paper_multipliers()
    rows = []
    for multiplier, own in runs.groupby("multiplier"):
        theirs = paper.loc[multiplier] if multiplier in paper.index else None
        rows.append({
            "x": f"{multiplier:g}", "seeds": len(own),
            "heads / FFN moved": f"{own['head_transfers'].mean():.0f} / {own['ffn_transfers'].mean():.0f}",
            "Top-1 (%)": mean_std(own["acc"].mean(), own["acc"].std()),
            "F1 (%)": mean_std(own["f1"].mean(), own["f1"].std()),
            "update ms/step": f"{own['update_ms_per_step'].mean():.3f}",
            "paper heads / FFN": "" if theirs is None else f"{theirs['head_transfers']:.0f} / {theirs['ffn_transfers']:.0f}",
            "paper Top-1 (%)": "" if theirs is None else mean_std(theirs["acc_mean"], theirs["acc_std"]),
            "paper ms/step": "" if theirs is None else f"{theirs['update_ms_per_step']:.3f}",
        })
    return pd.DataFrame(rows)


def _by_multiplier(runs: pd.DataFrame) -> pd.DataFrame:
    return runs.groupby("multiplier")[["acc", "update_ms_per_step", "head_transfers", "ffn_transfers"]].agg(
        ["mean", "std"])


def plot_multipliers(runs: pd.DataFrame):
    """Tables 16 and 17 as a figure: Top-1 gained over the 1x run (left) and the update cost
    per training step (right) against the transfer multiplier, ours beside the paper's
    (ViT/Tiny-ImageNet, rho = 0.5). Gains, not accuracies, share an axis: the two tasks'
    accuracies are far apart, what moving more units adds is comparable."""
    paper = _paper_multipliers()
    ours = _by_multiplier(runs)
    # each seed's gain over its own smallest-multiplier run: the seed-to-seed spread of the
    # accuracies themselves is larger than what the multiplier changes
    gains = paired_by_seed(runs, "multiplier", ours.index[0])
    fig, (gain_ax, cost_ax) = stacked_panels(2, 3.1)
    gain_ax.errorbar(gains.columns, gains.mean(), yerr=gains.std().fillna(0), marker="o", color=BARTER_COLOR,
                     capsize=3, label="barter, here (mean ± std of the gain paired by seed)")
    gain_ax.plot(paper.index, paper["acc_mean"] - paper["acc_mean"].iloc[0], marker="s", linestyle="--",
                 color="0.35", label="paper, ViT/Tiny-ImageNet (Table 16)")
    gain_ax.axhline(0, color="0.8", linewidth=0.8)
    gain_ax.set(xlabel="transfer multiplier", ylabel=f"Top-1 minus the {ours.index[0]:g}x run (points)",
                title="What moving more units buys")
    cost_ax.plot(ours.index, ours["update_ms_per_step", "mean"], marker="o", color=BARTER_COLOR, label="barter, here")
    cost_ax.plot(paper.index, paper["update_ms_per_step"], marker="s", linestyle="--", color="0.35",
                 label="paper, on an NVIDIA L40 (Table 17)")
    # a CPU's milliseconds beside an L40's hundredths of one: only a log axis shows both slopes
    cost_ax.set(xlabel="transfer multiplier", ylabel="update time per step (ms, log)",
                title="What it costs", yscale="log")
    plain_log_labels(cost_ax.yaxis)
    for ax in (gain_ax, cost_ax):
        ax.set_xticks(sorted(set(ours.index) | set(paper.index)))
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize="small", frameon=False,
                  ncols=2)  # off the data
    require_method_legend(fig)
    return fig


def _milliseconds(value: float) -> str:
    """``0.020 ms``; below what three decimals show, ``under 0.001 ms`` (never ``0.000 ms``)."""
    return f"{value:.3f} ms" if value >= 0.0005 else "under 0.001 ms"


def what_this_showed(runs: pd.DataFrame) -> str:
    """Chapter 08's conclusion as Markdown from its own runs: what the largest multiplier gained
    over the smallest (test Top-1, mean over seeds, beside the paper's Table 16 gain over the
    same multipliers where it has them), how many units it moved, and how its update cost grew
    (beside Table 17's)."""
    ours = _by_multiplier(runs)
    if len(ours) < 2:
        return "One multiplier was trained, so there is nothing to compare: pass several (`-y \"multipliers: [1, 4]\"`)."
    paper = _paper_multipliers()
    low, high = ours.index[0], ours.index[-1]
    gain = ours.loc[high, ("acc", "mean")] - ours.loc[low, ("acc", "mean")]
    line = (f"- **Accuracy.** {high:g}x moved {count_noun(ours.loc[high, ('head_transfers', 'mean')], 'head')} and "
            f"{count_noun(ours.loc[high, ('ffn_transfers', 'mean')], 'FFN channel')} against "
            f"{ours.loc[low, ('head_transfers', 'mean')]:.0f} and {ours.loc[low, ('ffn_transfers', 'mean')]:.0f} "
            f"at {low:g}x, and changed test Top-1 by {signed(gain)} points")
    if low in paper.index and high in paper.index:
        line += f" (the paper, ViT/Tiny-ImageNet: {signed(paper.loc[high, 'acc_mean'] - paper.loc[low, 'acc_mean'])})"
    line += "."
    gaps = paired_by_seed(runs, "multiplier", low)[high].dropna()
    if len(gaps) < 2:
        line += " One seed per multiplier: another seed moves a run by a few tenths of a point, so this decides nothing."
    else:
        where = "beyond" if beyond_noise(gaps.mean(), gaps.std(), len(gaps)) else "within"
        line += (f" Paired by seed over {len(gaps)} seeds, the gain's sd is {gaps.std():.2f}: {where} the seed "
                 f"noise ({RULE}).")
    low_cost, high_cost = ours.loc[low, ("update_ms_per_step", "mean")], ours.loc[high, ("update_ms_per_step", "mean")]
    shown = [_milliseconds(low_cost), _milliseconds(high_cost)]
    # a ratio of costs that print as 0.000 ms would be rounding noise ("0.0x", "infx")
    ratio = f" ({high_cost / low_cost:.1f}x)" if min(low_cost, high_cost) >= 0.0005 else ""
    cost = (f"- **Cost.** The topology updates took {shown[0]} per training step at {low:g}x and "
            f"{shown[1]} at {high:g}x" + ratio)
    if low in paper.index and high in paper.index:
        cost += (f"; the paper's grew {paper.loc[high, 'update_ms_per_step'] / paper.loc[low, 'update_ms_per_step']:.1f}x "
                 "(Table 17), in proportion to the units moved")
    return line + "\n" + cost + "."
