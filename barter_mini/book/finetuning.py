"""Fine-tuning from a pretrained dense model, and compute-matched BARTER (Figure 5, Tables 10, 11).

The paper pretrains ViT on Tiny-ImageNet and fine-tunes every method on CIFAR-100 for 100
epochs; BARTER's compact steps cost a fraction of the masked methods' full-size ones, so it
also trains *compute-matched*: as many cumulative training PFLOPs as RigL spends (906 epochs
at rho 0.1). On a CPU the transfer task runs offline on one dataset: a dense model is
pretrained on half of CIFAR-10's classes (airplane, automobile, bird, cat, deer) and every
method fine-tunes from it on the other half (dog, frog, horse, ship, truck), a new task with
a new classifier, as CIFAR-100 is for a Tiny-ImageNet model. Splitting one dataset by class
keeps the image statistics and size (so the whole backbone transfers) while the labels are
disjoint, which is what makes it transfer rather than continued training.
The ``paper`` profile runs the paper's own transfer (:data:`PAPER_TRANSFER`): ``vit-paper``
pretrained on Tiny-ImageNet, fine-tuned on CIFAR-100 resized to Tiny-ImageNet's 64 px.

Every fine-tuning run starts from the same pretrained checkpoint (per seed) through the run
cache, so the pretrained model is trained once and every method sees the same weights.
Fine-tuning halves the recipe's peak learning rate, as Table 5 does (1e-3 against 2e-3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd
from tqdm import tqdm

from ..training.cache import cached_train, run_dir
from ..training.data import DATASETS
from ..training.methods import check_methods, get_method
from ..training.recipes import get_recipe
from ..training.run_config import RunConfig
from ..core.models import get_model_config
from .experiments import mean_std, profile_run, read_paper_table
from .figures import plain_log_labels, stacked_panels
from .profiles import Profile
from .seed_noise import beyond_noise
from .palette import method_legend, method_style, require_method_legend
from .tables import listed, settings_markdown, signed


@dataclass(frozen=True)
class TransferTask:
    """Pretrain ``model`` on ``pretrain_dataset`` (its ``pretrain_classes``; None: all of
    them), fine-tune it on ``finetune_dataset`` (``finetune_classes``) with the images resized
    to ``img_size`` pixels (None: as they are)."""

    model: str
    pretrain_dataset: str
    pretrain_classes: tuple[int, ...] | None
    finetune_dataset: str
    finetune_classes: tuple[int, ...] | None
    img_size: int | None = None

    def _repr_markdown_(self) -> str:
        return settings_markdown(self, "The transfer", {"pretrain_classes": "all", "finetune_classes": "all",
                                                        "img_size": "as they are"})


#: Tables 10 and 11: ViT pretrained on Tiny-ImageNet, fine-tuned on all of CIFAR-100 at 64 px
#: (the size Table 11's PFLOPs imply; :func:`~barter_mini.training.data.views.resize_images`)
PAPER_TRANSFER = TransferTask(model="vit-paper", pretrain_dataset="tiny-imagenet", pretrain_classes=None,
                              finetune_dataset="cifar100", finetune_classes=None, img_size=64)


#: Table 11 matches BARTER's compute to RigL's, the strongest masked baseline
COMPUTE_REFERENCE = "rigl"
#: the two schedules of Table 11
FULL, MATCHED = "recipe epochs", "compute-matched"


def transfer_task(setup: Profile) -> TransferTask:
    """The profile's transfer task: on the ``paper`` profile with CIFAR-100 the paper's own
    (:data:`PAPER_TRANSFER`); otherwise pretrain on the first half of the dataset's classes and
    fine-tune on the second (CIFAR-10 0-4 -> 5-9)."""
    if setup.name == "paper" and setup.dataset == PAPER_TRANSFER.finetune_dataset:
        return PAPER_TRANSFER
    classes = DATASETS[setup.dataset].num_classes
    return TransferTask(model=setup.model, pretrain_dataset=setup.dataset, pretrain_classes=tuple(range(classes // 2)),
                        finetune_dataset=setup.dataset, finetune_classes=tuple(range(classes // 2, classes)))


def finetune_lr(setup: Profile) -> float:
    """Table 5: fine-tuning peaks at half the from-scratch learning rate."""
    return get_recipe(setup.recipe, get_model_config(transfer_task(setup).model).family).lr / 2


def pretraining_run(setup: Profile, seed: int) -> RunConfig:
    """The dense run that pretrains the task's model on its pretraining data."""
    task = transfer_task(setup)
    return replace(profile_run(setup, "dense", 1.0, seed), model=task.model, dataset=task.pretrain_dataset,
                   classes=task.pretrain_classes)


def pretrained_checkpoint(setup: Profile, seed: int) -> str:
    """The pretrained dense model (trained once, cached): its best.pt."""
    run = pretraining_run(setup, seed)
    cached_train(run)
    return str(run_dir(run) / "best.pt")


def finetune_run(setup: Profile, method: str, density: float, seed: int, pflops: float | None = None,
                 init: str | None = None) -> RunConfig:
    """``method`` fine-tuned on the task's fine-tuning data from ``init`` (default: the seed's
    pretrained checkpoint, trained if missing); with ``pflops``, trained until that much
    compute instead of the recipe's epochs."""
    task = transfer_task(setup)
    run = replace(profile_run(setup, method, density, seed), model=task.model, dataset=task.finetune_dataset,
                  init=init or pretrained_checkpoint(setup, seed), classes=task.finetune_classes,
                  img_size=task.img_size, lr=finetune_lr(setup))
    return run if pflops is None else replace(run, epochs=None, pflops=pflops)


def matched_run(setup: Profile, density: float, seed: int) -> RunConfig:
    """BARTER fine-tuned until the cumulative training PFLOPs of :data:`COMPUTE_REFERENCE` on
    the same density and seed (Table 11); that run is read from the cache (trained if missing)."""
    reference = cached_train(finetune_run(setup, COMPUTE_REFERENCE, density, seed))
    return finetune_run(setup, "barter", density, seed, pflops=reference["train_pflops"])


def finetuning_runs(setup: Profile, methods, densities, seeds) -> list[RunConfig]:
    """The fine-tuning runs of :func:`run_finetuning` after the recipe's epochs, in its order."""
    methods = check_methods(methods)
    return [finetune_run(setup, m, d, s) for m in methods
            for d in ([1.0] if get_method(m).fixed_density else densities) for s in seeds]


def _row(method: str, density: float, seed: int, schedule: str, metrics: dict) -> dict:
    steps_per_epoch = metrics["history"][0]["step"]         # the first epoch is always whole
    return {"method": method, "density": density, "seed": seed, "schedule": schedule,
            "epochs": metrics["steps"] / steps_per_epoch, "pflops": metrics["train_pflops"],
            "val_acc": 100 * metrics["val_acc"], "acc": 100 * metrics["test_acc"],
            "f1": 100 * metrics["test_macro_f1"]}


def run_finetuning(setup: Profile, methods, densities, seeds, matched: bool = True,
                   progress: bool = True) -> pd.DataFrame:
    """Fine-tune every method at every density and seed (dense once, at rho 1), and, with
    ``matched``, BARTER again until RigL's cumulative PFLOPs on the same seed and density.

    One row per run: method, density, seed, schedule (recipe epochs or compute-matched),
    epochs trained, cumulative training PFLOPs, validation and test Top-1, test macro-F1 (%).
    """
    rows = []
    for run in tqdm(finetuning_runs(setup, methods, densities, seeds), desc="fine-tuning runs", disable=not progress):
        rows.append(_row(run.method, run.density, run.seed, FULL, cached_train(run)))
    if matched:
        for density, seed in [(d, s) for d in densities for s in seeds]:
            rows.append(_row("barter", density, seed, MATCHED, cached_train(matched_run(setup, density, seed))))
    return pd.DataFrame(rows)


def summarize_finetuning(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std over seeds per method, density and schedule (Tables 10, 11)."""
    grouped = runs.groupby(["method", "density", "schedule"], sort=False)
    return grouped.agg(epochs=("epochs", "mean"), pflops=("pflops", "mean"), acc_mean=("acc", "mean"),
                       acc_std=("acc", "std"), f1_mean=("f1", "mean"), f1_std=("f1", "std"),
                       seeds=("seed", "count")).reset_index()


def paper_finetuning() -> pd.DataFrame:
    """Tables 10 and 11 (ViT fine-tuned on CIFAR-100), schedules named as ours."""
    paper = read_paper_table("table10_11_finetuning_vit_cifar100")
    return paper.assign(schedule=paper["schedule"].replace({"100 epochs": FULL}))


def finetuning_beside_paper(summary: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Table 10 / 11 layout: ours (epochs, PFLOPs, Top-1) beside the paper's (the full
    summary, macro-F1 and seeds included, is what the chapter saves as CSV)."""
    merged = summary.merge(paper, on=["method", "density", "schedule"], how="left", suffixes=("", "_paper"))
    return pd.DataFrame({
        "method": merged["method"], "rho": merged["density"], "schedule": merged["schedule"],
        "epochs": merged["epochs"].round(2), "PFLOPs": merged["pflops"].map("{:.3g}".format),
        "Top-1 (%)": [mean_std(m, s) for m, s in zip(merged["acc_mean"], merged["acc_std"])],
        "paper epochs": merged["epochs_paper"], "paper PFLOPs": merged["pflops_paper"],
        "paper Top-1 (%)": [mean_std(m, s) for m, s in zip(merged["acc_mean_paper"], merged["acc_std_paper"])],
    })


def _by_seed(at: pd.DataFrame, method: str, schedule: str) -> pd.DataFrame:
    """The runs of ``method`` under ``schedule`` among ``at`` (one density), indexed by seed."""
    return at[(at["method"] == method) & (at["schedule"] == schedule)].set_index("seed")


def compute_matched_gains(runs: pd.DataFrame) -> pd.DataFrame:
    """Table 11 in differences: per density, compute-matched BARTER minus BARTER after the
    recipe's epochs, and minus RigL, in points of test Top-1 paired by seed (mean, sample
    std), with the compute each spent."""
    rows = []
    for density, at in runs[runs["density"] < 1].groupby("density"):
        matched, full, reference = (_by_seed(at, method, schedule) for method, schedule in
                                    (("barter", MATCHED), ("barter", FULL), (COMPUTE_REFERENCE, FULL)))
        if matched.empty:
            continue
        seeds = matched.index.intersection(full.index).intersection(reference.index)
        over_full = matched.loc[seeds, "acc"] - full.loc[seeds, "acc"]
        over_reference = matched.loc[seeds, "acc"] - reference.loc[seeds, "acc"]
        rows.append({"rho": density, "seeds": len(seeds),
                     "BARTER epochs": mean_std(full.loc[seeds, "epochs"].mean(), float("nan")),
                     "matched epochs": mean_std(matched.loc[seeds, "epochs"].mean(), float("nan")),
                     "matched minus BARTER (points)": mean_std(over_full.mean(), over_full.std()),
                     f"matched minus {COMPUTE_REFERENCE} (points)": mean_std(over_reference.mean(), over_reference.std())})
    return pd.DataFrame(rows)


def plot_compute_matched(summary: pd.DataFrame, paper: pd.DataFrame | None = None, title: str = "this run"):
    """Figure 5 (b): Top-1 against cumulative training PFLOPs: BARTER after the recipe's epochs
    (filled) and compute-matched (hollow), RigL at the same densities, dense for reference;
    each point labelled with its density. With ``paper``, the paper's panel below it;
    ``title`` names the first panel (a recorded grid says so)."""
    panels = [(title, summary)] + ([("paper, ViT fine-tuned on CIFAR-100", paper)] if paper is not None else [])
    fig, axes = stacked_panels(len(panels), 3.0, legend_in=0.8)
    densities = set(summary["density"])
    for ax, (title, table) in zip(axes, panels):
        shown = table[table["method"].isin(["barter", COMPUTE_REFERENCE, "dense"])
                      & (table["density"].isin(densities) | (table["method"] == "dense"))]
        for (method, schedule), rows in shown.groupby(["method", "schedule"], sort=False):
            hollow = schedule == MATCHED
            style = method_style(method)
            ax.errorbar(rows["pflops"], rows["acc_mean"], yerr=rows["acc_std"].fillna(0), linestyle="none",
                        capsize=3, mfc="white" if hollow else style["color"],
                        label=f"{method}, {schedule}" if method != "dense" else "dense (rho = 1)", **style)
            for x, y, d in zip(rows["pflops"], rows["acc_mean"], rows["density"]):
                ax.annotate(f"{d:g}", (x, y), textcoords="offset points", xytext=(5, 4), fontsize="small")
        ax.set_xscale("log")
        plain_log_labels(ax.xaxis)
        ax.set_xlabel("cumulative training compute (PFLOPs, log scale)")
        ax.set_ylabel("test Top-1 (%)")
        ax.margins(x=0.12)  # room for the density labels at the ends
        ax.set_title(title)
    method_legend(fig, columns=3)
    require_method_legend(fig)
    return fig


def _paired(at: pd.DataFrame, method: str, schedule: str, reference: pd.DataFrame) -> pd.Series:
    """``method``'s test Top-1 minus ``reference``'s, seed by seed (the seeds both have)."""
    own, other = _by_seed(at, method, schedule)["acc"], reference.set_index("seed")["acc"]
    seeds = own.index.intersection(other.index)
    return own.loc[seeds] - other.loc[seeds]


def _gap(diff: pd.Series) -> str:
    """A paired gap in words: mean ± sample std over the seeds, and whether it is beyond the
    seed noise (:func:`~barter_mini.book.seed_noise.beyond_noise`); one seed has no spread."""
    if len(diff) < 2:
        return f"{signed(diff.mean())} points"
    where = "beyond" if beyond_noise(diff.mean(), diff.std(), len(diff)) else "within"
    return f"{signed(diff.mean())} ± {diff.std():.2f} points ({where} the seed noise)"


def reading_the_results(runs: pd.DataFrame, paper: pd.DataFrame | None = None) -> str:
    """The chapter's answer as Markdown bullets, composed from its runs (:func:`run_finetuning`)
    beside the paper's Tables 10 and 11 where they have the density: BARTER's compute as a
    share of RigL's, what compute-matched training gains over BARTER's recipe epochs and over
    RigL (test Top-1, paired by seed), and where BARTER ranks after the recipe's epochs."""
    paper = paper if paper is not None else pd.DataFrame(columns=["method", "density", "schedule"])
    lines = []
    for density, at in runs[runs["density"] < 1].groupby("density"):
        full = at[at["schedule"] == FULL]
        barter, rigl = (full[full["method"] == m] for m in ("barter", COMPUTE_REFERENCE))
        theirs = paper[(paper["density"] == density) & (paper["schedule"] == FULL)].set_index("method")
        seeds = at["seed"].nunique()
        head = f"**rho = {density:g}** ({seeds} seed{'s' if seeds > 1 else ''})"
        if not barter.empty and not rigl.empty:
            share = barter["pflops"].mean() / rigl["pflops"].mean()
            line = f"{head}: BARTER's fine-tuning cost {share:.2f} of RigL's training PFLOPs"
            if {"barter", COMPUTE_REFERENCE} <= set(theirs.index):
                line += f" (paper: {theirs.loc['barter', 'pflops'] / theirs.loc[COMPUTE_REFERENCE, 'pflops']:.2f})"
            lines.append(line + ".")
            matched = at[(at["method"] == "barter") & (at["schedule"] == MATCHED)]
            if not matched.empty:
                over_full = _paired(at, "barter", MATCHED, barter)
                over_rigl = _paired(at, "barter", MATCHED, rigl)
                line = (f"Compute-matched, BARTER trained {matched['epochs'].mean():.1f} epochs instead of "
                        f"{barter['epochs'].mean():.0f}: {_gap(over_full)} of test Top-1 over its recipe "
                        f"epochs and {_gap(over_rigl)} over RigL")
                their_matched = paper[(paper["density"] == density) & (paper["schedule"] == MATCHED)
                                      & (paper["method"] == "barter")]
                if not their_matched.empty and {"barter", COMPUTE_REFERENCE} <= set(theirs.index):
                    gained = their_matched["acc_mean"].iloc[0]
                    line += (f" (paper: {signed(gained - theirs.loc['barter', 'acc_mean'])} and "
                             f"{signed(gained - theirs.loc[COMPUTE_REFERENCE, 'acc_mean'])})")
                lines.append(line + ".")
            ranked = full[full["method"] != "dense"].groupby("method")["acc"].mean().sort_values(ascending=False)
            above = [m for m in ranked.index if ranked[m] > ranked["barter"]]
            vs_rigl = _paired(at, "barter", FULL, rigl)
            ahead = f" (above it: {listed(above)})" if above else ""
            lines.append(f"After the recipe's epochs BARTER ({ranked['barter']:.2f}) is {_gap(vs_rigl)} against "
                         f"RigL and ranks {len(above) + 1} of the {len(ranked)} sparse methods{ahead}.")
    if runs["seed"].nunique() < 2:
        lines.append("On one seed a gap of a point or less is within the seed-to-seed noise: pass "
                     "`seeds: [0, 1, 2]` before reading an ordering into these numbers.")
    return "\n".join(f"* {line}" for line in lines)


def headline(runs: pd.DataFrame) -> str:
    """Chapter 06's answer in one sentence for the introduction, from the same runs as
    :func:`reading_the_results`, at the lowest density with a compute-matched run: BARTER's
    compute as a share of RigL's, its gap to RigL after the recipe's epochs, and what
    RigL's compute buys it (test Top-1, paired by seed), with the epochs that buy it."""
    sparse = runs[runs["density"] < 1]
    matched_densities = sorted(set(sparse.loc[(sparse["method"] == "barter") & (sparse["schedule"] == MATCHED),
                                              "density"]))
    if not matched_densities:
        return "No compute-matched BARTER run was trained in this build."
    density = matched_densities[0]
    at = sparse[sparse["density"] == density]
    full = at[at["schedule"] == FULL]
    barter, rigl = (full[full["method"] == m] for m in ("barter", COMPUTE_REFERENCE))
    if barter.empty or rigl.empty:
        return f"At rho = {density:g} this build has no BARTER and {COMPUTE_REFERENCE} pair to compare."
    matched = at[(at["method"] == "barter") & (at["schedule"] == MATCHED)]
    seeds = at["seed"].nunique()
    sentence = (f"At rho = {density:g}, BARTER fine-tuned for {barter['pflops'].mean() / rigl['pflops'].mean():.2f} "
                f"of RigL's training compute and ended {_gap(_paired(at, 'barter', FULL, rigl))} against RigL; "
                f"given RigL's compute ({matched['epochs'].mean():.1f} epochs instead of {barter['epochs'].mean():.0f}, "
                f"so much of the gain is simply longer training) it gained "
                f"{_gap(_paired(at, 'barter', MATCHED, barter))} over its recipe epochs "
                f"({seeds} seed{'s' if seeds > 1 else ''}).")
    return sentence
