"""The paper's numbers that the book's Markdown pages quote, read from ``data/paper/`` (the
same files the notebooks compare against), as MyST substitutions: a page writes
``{{ iphone_speedup }}`` and the build fills it in, so no number is typed in two places.
Beside them, the numbers of ``barter_mini``'s own models that the pages set against the
paper's (:func:`model_substitutions`: budgets, parameter counts, GFLOPs, the schedule), so
that they follow the code.

:func:`book_substitutions` is what the book build writes into the staged ``_config.yml``
(``parse.myst_substitutions``).
"""

from __future__ import annotations

import inspect
from functools import cache

from ..core.barter import BarterSettings, TransferSchedule
from ..core.budgets import compute_budget
from ..core.counting import count_parameters, training_gflops_per_image
from ..core.models import build_model, get_model_config
from ..training.data.datasets import load_dataset
from ..training.recipes import RECIPES
from .claims import claim
from .default_choices import defaults_substitutions
from .experiments import paper_from_scratch, read_paper_table
from .room import derivation_substitutions
from .tables import listed

#: CIFAR-100's official training images, of which ``load_dataset`` holds ``val_fraction`` out
CIFAR100_TRAIN_IMAGES = 50_000


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


def _table3():
    """Table 3's rows with, per row, ``barter_mini``'s budget
    (:func:`~barter_mini.core.budgets.compute_budget`), its
    planned transfer counts at multiplier 1 and the model's configuration."""
    table = read_paper_table("table03_budgets")
    rows = []
    for row in table.itertuples(index=False):
        config = get_model_config(row.model)
        budget = compute_budget(config, row.density)
        planned = TransferSchedule(1, budget, BarterSettings()).planned_totals()
        rows.append((row, config, budget, planned))
    return rows


def budget_table() -> str:
    """The method chapter's table of budgets: Table 3's (H, C) beside this rule's and rho L F."""
    lines = [r"| model | $\rho$ | Table 3 $(H, C)$ | this rule $(H, C)$ | $\rho L F$ |",
             "|---|---:|---:|---:|---:|"]
    for row, config, budget, _ in _table3():
        full_ffn = config.depth * config.ffn_per_layer
        lines.append(f"| `{row.model}` | {row.density:g} | {row.heads}, {row.ffn:,} | {budget.heads}, {budget.ffn:,} "
                     f"| {round(row.density * full_ffn):,} |")
    return "\n".join(lines)


def transfer_count_table() -> str:
    """The method chapter's table of transfer counts: Table 3's (K_H, K_C) beside the counts
    :class:`~barter_mini.core.barter.TransferSchedule` plans from ``barter_mini``'s budgets."""
    lines = [r"| model | $\rho$ | Table 3 $(K_H, K_C)$ | `barter_mini` $(K_H, K_C)$ |", "|---|---:|---:|---:|"]
    for row, _, _, planned in _table3():
        lines.append(f"| `{row.model}` | {row.density:g} | {row.k_heads}, {row.k_ffn} "
                     f"| {planned['heads']}, {planned['ffn']} |")
    return "\n".join(lines)


def table3_substitutions() -> dict[str, str]:
    """The method chapter's Table 3 (budgets and transfer counts): the two tables, the numbers
    its prose quotes, and how ``barter_mini``'s budgets and counts differ from the paper's."""
    rows = {(row.model, row.density): (row, config, budget, planned)
            for row, config, budget, planned in _table3()}
    cct01, cct07, vit03 = (rows[case][0] for case in (("cct-paper", 0.1), ("cct-paper", 0.7), ("vit-paper", 0.3)))
    head_changes = [abs(planned["heads"] - row.k_heads) for row, _, _, planned in rows.values()]
    ffn_changes = [abs(planned["ffn"] - row.k_ffn) for row, _, _, planned in rows.values()]
    claim("every head count stays the paper's and each FFN count moves by at most one",
          max(head_changes) == 0 and max(ffn_changes) <= 1 and any(ffn_changes),
          head_changes=head_changes, ffn_changes=ffn_changes)

    def rho_l_h(case) -> float:
        row, config = rows[case][:2]
        return row.density * config.depth * config.heads_per_layer

    vit_config = rows["vit-paper", 0.3][1]
    return {
        "budget_table": budget_table(),
        "transfer_count_table": transfer_count_table(),
        # Table 3 writes the per-layer range with a hyphen: "1-2"
        "table3_cct_rho01_heads_listed": f"{cct01.heads} ({cct01.heads_per_layer.replace('-', '–')})",
        "table3_cct_rho01_ffn_listed": f"{cct01.ffn:,} ({cct01.ffn_per_layer.replace('-', '–')})",
        "table3_vit_rho03_heads": f"{vit03.heads}",
        "table3_cct_rho07_heads": f"{cct07.heads}",
        "table3_cct_rho07_ffn": f"{cct07.ffn:,}",
        "table3_cct_rho07_k_heads": f"{cct07.k_heads}",
        "table3_cct_rho07_k_ffn": f"{cct07.k_ffn}",
        "vit_rho03_rho_l_h": (rf"${vit03.density:g} \cdot {vit_config.depth} \cdot {vit_config.heads_per_layer}"
                              rf" = {rho_l_h(('vit-paper', 0.3)):.4g}$"),
        "vit_rho03_heads": f"{rows['vit-paper', 0.3][2].heads}",
        "cct_rho07_rho_l_h": f"{rho_l_h(('cct-paper', 0.7)):.4g}",
        "budget_ffn_gap_max": f"{max(abs(budget.ffn - row.ffn) for row, _, budget, _ in rows.values())}",
        "transfer_ffn_counts_changed": f"{sum(1 for change in ffn_changes if change)}",
    }


def table15_substitutions() -> dict[str, str]:
    """The method chapter's Table 15 numbers: BARTER's training GFLOPs per image and exported
    parameters (M) on CCT at densities 0.1 and 0.5, as the paper prints them."""
    table = read_paper_table("table15_compute_and_size_cct")
    barter = table[table["method"] == "barter"].set_index("density")
    return {key: f"{barter.loc[density, column]:.{places}f}"
            for density in (0.1, 0.5)
            for key, column, places in ((f"table15_rho{density:g}_gflops".replace(".", ""), "train_gflops_per_image", 3),
                                        (f"table15_rho{density:g}_params_m".replace(".", ""), "params_m", 4))}


def ablation_substitutions() -> dict[str, str]:
    """The method chapter's Table 12: Top-1 (%) of BARTER, its three random ablations and the
    static model, CCT on CIFAR-100, at the table's one density."""
    table = read_paper_table("table12_ablations_cct_cifar100")
    (density,) = table["density"].unique()
    acc = table.set_index("method")["acc_mean"]
    numbers = {"table12_density": f"{density:g}"}
    for method in ("barter", "random-receiver", "random-donor", "random-pair", "static"):
        numbers[f"table12_{method.replace('-', '_')}_acc"] = f"{acc[method]:.2f}"
    return numbers


def steps_per_epoch(batch_size: int, train_images: int = CIFAR100_TRAIN_IMAGES) -> int:
    """Optimizer steps per epoch on ``train_images`` less ``load_dataset``'s default
    validation share, in full batches (the trainer drops a last partial batch)."""
    val_fraction = inspect.signature(load_dataset).parameters["val_fraction"].default
    return (train_images - round(val_fraction * train_images)) // batch_size


def schedule_substitutions(density: float = 0.5) -> dict[str, str]:
    """The method chapter's worked schedule: CCT with the paper recipe (``RECIPES["paper-cct"]``,
    Table 5) at ``density`` and the default :class:`~barter_mini.core.barter.BarterSettings`:
    its steps, its update steps, how many of them move units, and when."""
    recipe = RECIPES["paper-cct"]
    per_epoch = steps_per_epoch(recipe.batch_size)
    total = recipe.epochs * per_epoch
    settings = BarterSettings()
    schedule = TransferSchedule(total, compute_budget(get_model_config("cct-paper"), density), settings)
    moves = {step: schedule.transfers_at(step) for step in schedule.update_steps}
    end = settings.t_end * total
    window = schedule.update_steps[-1]

    def ffn_between(low: float, high: float) -> int:
        return sum(m["ffn"] for step, m in moves.items() if low < step <= high)

    return {
        "cct_steps_per_epoch": f"{per_epoch}",
        "schedule_total_steps": f"{total:,}",
        "schedule_end_step": f"{end:,.0f}",
        "schedule_updates": f"{len(moves):,}",
        "schedule_moving_updates": f"{sum(1 for m in moves.values() if any(m.values()))}",
        "schedule_ffn_updates": f"{sum(1 for m in moves.values() if m['ffn'])}",
        "schedule_head_updates": f"{sum(1 for m in moves.values() if m['heads'])}",
        "schedule_head_steps": listed(f"{step:,}" for step, m in moves.items() if m["heads"]),
        "schedule_ffn_first_quarter": f"{ffn_between(0, window / 4)}",
        "schedule_ffn_last_quarter": f"{ffn_between(3 * window / 4, window)}",
    }


def settings_substitutions() -> dict[str, str]:
    """The defaults of :class:`~barter_mini.core.barter.BarterSettings` that the method and
    reproduction pages state (update interval and horizon, transfer fractions, split factor,
    symmetry noise, EMA factor, protection, multiplier, pruning score, clone moments), so a
    changed default changes the pages."""
    settings = BarterSettings()
    return {
        "default_delta_t": f"{settings.delta_t}",
        "default_t_end": f"{settings.t_end:g}",
        "default_t_end_percent": f"{100 * settings.t_end:g} %",
        "default_head_fraction": f"{settings.head_fraction:g}",
        "default_ffn_fraction": f"{settings.ffn_fraction:g}",
        "default_split_alpha": f"{settings.split_alpha:g}",
        "default_symmetry_noise": f"{settings.symmetry_noise:g}",
        "default_stats_beta": f"{settings.stats_beta:g}",
        "default_protected_steps": f"{settings.protected_steps}",
        "default_transfer_multiplier": f"{settings.transfer_multiplier:g}",
        "default_pruning_score": f"`{settings.pruning_score}`",
        "default_clone_moments": f'`"{settings.clone_moments}"`',
    }


def model_substitutions() -> dict[str, str]:
    """The introduction's counts of ``barter_mini``'s CCT (what ``barter-mini describe`` prints
    for ``cct-paper``): parameters and training GFLOPs per image at full width and at density
    0.1, and the budgets there. Built once per process (two models)."""
    return dict(_model_numbers())


@cache
def _model_numbers() -> dict[str, str]:
    config = get_model_config("cct-paper")
    dense, compact = build_model(config, 1.0), build_model(config, 0.1)
    budget = compute_budget(config, 0.1)
    return {
        "cct_layers": f"{config.depth}",
        "cct_dense_params": f"{count_parameters(dense):,}",
        "cct_dense_gflops": f"{training_gflops_per_image(dense):.3g}",
        "cct_rho01_params": f"{count_parameters(compact):,}",
        "cct_rho01_gflops": f"{training_gflops_per_image(compact):.3g}",
        "cct_rho01_heads": f"{budget.heads}",
        "cct_rho01_ffn": f"{budget.ffn:,}",
    }


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
    iphone_table = read_paper_table("table02_iphone_cct").set_index("method")
    iphone = iphone_table["s_per_epoch"]
    epochs = read_paper_table("table06_08_epoch_time_gpu")
    cct = epochs[epochs["model"] == "cct-paper"]
    masked = cct[cct["method"] != "dense"]["s_per_epoch_mean"]     # SET, SNFS, RigL and SRigL
    compact = read_paper_table("table13_static_vs_barter_cct_cifar100")
    by_density = {method: compact[compact["method"] == method].sort_values("density")
                  for method in ("static", "barter")}
    masked_compute = read_paper_table("table07_compute_masked_cct")
    ahead = [density for density in sorted(paper[paper["method"] == "barter"]["density"])
             if _accuracy(paper, "rigl", density) > _accuracy(paper, "barter", density)]
    return {
        "paper_accuracy_table": accuracy_table(paper),
        "paper_dense_acc": f"{_accuracy(paper, 'dense', 1.0):.2f}",
        "iphone_dense_s": f"{iphone['dense']:,.2f}",
        "iphone_rigl_s": f"{iphone['rigl']:,.2f}",
        "iphone_barter_s": f"{iphone['barter']:,.2f}",
        "iphone_speedup": f"{iphone['rigl'] / iphone['barter']:.2f}",
        "iphone_density": f"{iphone_table.loc['barter', 'density']:g}",
        "table6_dense_s": f"{float(cct[cct['method'] == 'dense']['s_per_epoch_mean'].iloc[0]):.2f}",
        "table6_masked_low_s": f"{masked.min():.2f}",
        "table6_masked_high_s": f"{masked.max():.2f}",
        "table6_density_low": f"{cct[cct['method'] != 'dense']['density'].min():g}",
        "table6_density_high": f"{cct[cct['method'] != 'dense']['density'].max():g}",
        "table7_masked_gflops": f"{float(masked_compute['train_gflops_per_image'].iloc[0]):.2f}",
        "rigl_ahead_densities": listed(f"{density:g}" for density in ahead),
        "table13_barter_accs": listed(f"{acc:.2f}" for acc in by_density["barter"]["acc_mean"]),
        "table13_static_accs": listed(f"{acc:.2f}" for acc in by_density["static"]["acc_mean"]),
        "table13_densities": ", ".join(f"{d:g}" for d in by_density["barter"]["density"]),
        "table13_std_low": f"{compact['acc_std'].min():.1f}",
        "table13_std_high": f"{compact['acc_std'].max():.1f}",
        **cost_substitutions(),
        **table3_substitutions(),
        **table15_substitutions(),
        **ablation_substitutions(),
        **schedule_substitutions(),
        **settings_substitutions(),
        **model_substitutions(),
    }


def recorded_substitutions() -> dict[str, str]:
    """What the pages state from the book's recorded measurements (``data/*.csv``, not the
    paper's): the decision behind BARTER's defaults (:mod:`~barter_mini.book.default_choices`)
    and why BARTER as derived loses (:mod:`~barter_mini.book.room`)."""
    return {**defaults_substitutions(), **derivation_substitutions()}


def book_substitutions() -> dict[str, str]:
    """Every substitution the book build writes: the paper's numbers and the recorded ones."""
    return {**paper_substitutions(), **recorded_substitutions()}
