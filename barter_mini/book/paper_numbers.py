"""The paper's numbers that the book's Markdown pages quote, read from ``data/paper/`` (the
same files the notebooks compare against), as MyST substitutions: a page writes
``{{ iphone_speedup }}`` and the build fills it in, so no number is typed in two places.

:func:`paper_substitutions` is what the book build writes into the staged ``_config.yml``
(``parse.myst_substitutions``).
"""

from __future__ import annotations

from ..training.recipes import RECIPES
from .experiments import paper_from_scratch, read_paper_table


def _accuracy(table, method: str, density: float) -> float:
    return float(table[(table["method"] == method) & (table["density"] == density)]["acc_mean"].iloc[0])


def accuracy_table(paper) -> str:
    """The introduction's table: Static and BARTER (Table 13) beside RigL (Table 1), CCT on
    CIFAR-100, Top-1 (%) per density, as Markdown (``paper``:
    :func:`~barter_mini.book.experiments.paper_from_scratch`)."""
    lines = ["| density | static compact model | BARTER | RigL |", "|---:|---:|---:|---:|"]
    for density in sorted(paper[paper["method"] == "barter"]["density"]):
        lines.append(f"| {density:g} | " + " | ".join(f"{_accuracy(paper, method, density):.2f}"
                                                     for method in ("static", "barter", "rigl")) + " |")
    return "\n".join(lines)


def duration(seconds: float) -> str:
    """A run's length as a reader plans with it: minutes under an hour ("40 min"), else hours
    to a tenth ("3.8 h")."""
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def run_time(seconds: float) -> str:
    """A run's length in seconds, rounded to hundreds, and in minutes or hours:
    ``2,400 s ≈ 40 min`` for 2,380 s."""
    return f"{round(seconds, -2):,.0f} s ≈ {duration(seconds)}"


def duration_range(low: float, high: float) -> str:
    """The lengths of the shortest and the longest of several runs: one :func:`duration` when
    both read the same ("3.8 h"), else a range ("1.2–1.3 h")."""
    if duration(low) == duration(high):
        return duration(low)
    if low >= 3600:
        return f"{low / 3600:.1f}–{high / 3600:.1f} h"
    return f"{duration(low)}–{duration(high)}"


def _listed(values) -> str:
    """``66.13, 71.38, 72.85 and 73.26``."""
    shown = [f"{value:.2f}" for value in values]
    return ", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1 else shown[0]


def cost_substitutions() -> dict[str, str]:
    """The reproduction chapter's cost of a paper run: the paper's GPU time per epoch (Tables 6
    and 8: dense and masked CCT on CIFAR-100 and ViT on Tiny-ImageNet) and per epoch-length
    segment (Table 14: Static and BARTER on CCT), each times the epochs of its recipe (Table 5,
    ``RECIPES["paper-cct"]`` and ``["paper-vit"]``); BARTER's peak memory (Table 14) and its
    topology updates' cost (Table 17, multiplier 1)."""
    epochs = read_paper_table("table06_08_epoch_time_gpu")
    cct, vit = (epochs[epochs["model"] == model] for model in ("cct-paper", "vit-paper"))
    cct_dense = float(cct[cct["method"] == "dense"]["s_per_epoch_mean"].iloc[0])
    rigl = cct[cct["method"] == "rigl"]["s_per_epoch_mean"]
    vit_dense = float(vit[vit["method"] == "dense"]["s_per_epoch_mean"].iloc[0])
    vit_masked = vit[vit["method"] != "dense"]["s_per_epoch_mean"]     # SET, SNFS, RigL and SRigL
    compact = read_paper_table("table14_static_vs_barter_gpu").set_index(["method", "density"])
    updates = read_paper_table("table16_17_transfer_multiplier_vit").set_index("multiplier").loc[1]
    cct_epochs, vit_epochs = RECIPES["paper-cct"].epochs, RECIPES["paper-vit"].epochs
    numbers = {
        "cct_epochs": f"{cct_epochs}", "vit_epochs": f"{vit_epochs}",
        "table6_rigl_low_s": f"{rigl.min():.2f}", "table6_rigl_high_s": f"{rigl.max():.2f}",
        "table8_dense_s": f"{vit_dense:.2f}",
        "table8_masked_low_s": f"{vit_masked.min():.2f}", "table8_masked_high_s": f"{vit_masked.max():.2f}",
        "cost_cct_dense": run_time(cct_epochs * cct_dense),
        "cost_cct_dense_h": f"{cct_epochs * cct_dense / 3600:.1f}",
        # a row of the paper's CCT tables needs three dense reference runs (three seeds)
        "cost_cct_three_dense_h": f"{3 * cct_epochs * cct_dense / 3600:.0f}",
        "cost_cct_rigl": duration_range(cct_epochs * rigl.min(), cct_epochs * rigl.max()),
        "cost_vit_dense": run_time(vit_epochs * vit_dense),
        "cost_vit_masked": duration_range(vit_epochs * vit_masked.min(), vit_epochs * vit_masked.max()),
        "table17_update_ms": f"{updates['update_ms_per_step']:.3f}",
        "table17_update_s": f"{updates['update_s_per_schedule']:.0f}",
    }
    for method, density in (("barter", 0.1), ("barter", 0.3), ("static", 0.5)):
        row = compact.loc[(method, density)]
        key = f"{method}_rho{density:g}".replace(".", "")
        numbers[f"table14_{key}_s"] = f"{row['s_per_segment_mean']:.2f}"
        numbers[f"table14_{key}_gib"] = f"{row['peak_gib_mean']:.3f}"
        numbers[f"cost_cct_{key}"] = run_time(cct_epochs * row["s_per_segment_mean"])
    return numbers


def paper_substitutions() -> dict[str, str]:
    """Every paper number the Markdown pages quote, by substitution key."""
    paper = paper_from_scratch()
    iphone = read_paper_table("table02_iphone_cct").set_index("method")["s_per_epoch"]
    epochs = read_paper_table("table06_08_epoch_time_gpu")
    cct = epochs[epochs["model"] == "cct-paper"]
    masked = cct[cct["method"] != "dense"]["s_per_epoch_mean"]     # SET, SNFS, RigL and SRigL
    compact = read_paper_table("table13_static_vs_barter_cct_cifar100")
    by_density = {method: compact[compact["method"] == method].sort_values("density")
                  for method in ("static", "barter")}
    return {
        "paper_accuracy_table": accuracy_table(paper),
        "paper_dense_acc": f"{_accuracy(paper, 'dense', 1.0):.2f}",
        "iphone_dense_s": f"{iphone['dense']:,.2f}",
        "iphone_rigl_s": f"{iphone['rigl']:,.2f}",
        "iphone_barter_s": f"{iphone['barter']:,.2f}",
        "iphone_speedup": f"{iphone['rigl'] / iphone['barter']:.2f}",
        "table6_dense_s": f"{float(cct[cct['method'] == 'dense']['s_per_epoch_mean'].iloc[0]):.2f}",
        "table6_masked_low_s": f"{masked.min():.2f}",
        "table6_masked_high_s": f"{masked.max():.2f}",
        "table13_barter_accs": _listed(by_density["barter"]["acc_mean"]),
        "table13_static_accs": _listed(by_density["static"]["acc_mean"]),
        "table13_densities": ", ".join(f"{d:g}" for d in by_density["barter"]["density"]),
        "table13_std_low": f"{compact['acc_std'].min():.1f}",
        "table13_std_high": f"{compact['acc_std'].max():.1f}",
        **cost_substitutions(),
    }
