"""Helpers for the walkthrough notebook: a briefly trained model to operate on, the scores
behind each choice of one topology update (the notebook calls the selection rules of
:mod:`barter_mini.core.barter` itself), and the notebook's training run."""

from __future__ import annotations

from dataclasses import replace
from itertools import cycle, islice

import pandas as pd
import torch

from ..core.barter import select_donors, select_parents
from ..core.models import get_model_config
from ..core.unit_statistics import DEFAULT_PRUNING_SCORE, LayerStatistics, UnitStatistics
from ..training.data import load_dataset, make_loaders
from ..training.parts import parts_for_new_model
from ..training.run_config import RunConfig
from ..training.optimization import seed_everything
from .experiments import profile_run
from .profiles import Profile
from .tables import page_table

#: what the walkthrough shows of its training run (``training_run.json`` adds the
#: allocation history)
RUN_SUMMARY_KEYS = ("method", "model", "dataset", "density", "seed", "epochs", "val_acc", "test_acc",
                    "test_macro_f1", "wall_time_s", "transfers_planned", "transfers_executed", "params",
                    "train_gflops_per_image")


def warmed_up_model(profile: Profile, density: float, seed: int = 0, steps: int = 30,
                    batch_size: int = 64, lr: float = 1e-3, pruning_score: str = DEFAULT_PRUNING_SCORE):
    """A compact model of ``profile`` trained ``steps`` AdamW steps on real images.

    Returns ``(model, optimizer, statistics, probe)``: the model in eval mode (so outputs are
    deterministic), its optimizer with live state, the statistics its hooks gathered (with
    ``pruning_score``, one of :data:`~barter_mini.core.unit_statistics.PRUNING_SCORES`), and a
    fixed batch of images to compare outputs on.
    """
    seed_everything(seed)
    splits = load_dataset(profile.dataset, seed=seed, train_subset=steps * batch_size, augment=False)
    loader, _, _ = make_loaders(splits, batch_size, seed)
    info = splits.info
    config = get_model_config(profile.model).for_data(info.img_size, info.in_chans, info.num_classes)
    model, optimizer, statistics = briefly_trained(config, density, islice(cycle(loader), steps), lr,
                                                   pruning_score)
    probe = next(iter(loader))[0][:32]
    return model.eval(), optimizer, statistics, probe


def briefly_trained(config, density: float, batches, lr: float = 1e-3,
                    pruning_score: str = DEFAULT_PRUNING_SCORE):
    """A compact model of ``config`` at ``density`` trained one step per ``(images, labels)``
    batch as ``train`` steps a Static run (:func:`~barter_mini.training.parts.parts_for_new_model`:
    fused AdamW, the quick recipe's weight decay and label smoothing at learning rate ``lr``),
    with its statistics hooks attached (by default the method's own pruning
    score, one default for both kinds). Returns ``(model, optimizer, statistics)``, the model
    in train mode."""
    run = RunConfig(method="static", model=config.name, density=density, recipe="quick", lr=lr)
    parts = parts_for_new_model(run, config, 1, torch.device("cpu"))
    statistics = UnitStatistics(parts.model, pruning_score=pruning_score)
    for x, y in batches:
        parts.step(x, y, None)
    return parts.model, parts.optimizer, statistics


#: significant figures of the scores in the walkthrough's tables: pruning scores of different
#: layers can differ by orders of magnitude, and a fixed number of decimals would show 0.00
SCORE_FIGURES = 4


def layer_scores(stats: list[LayerStatistics], counts: list[int], full_width: int, receiver: int | None,
                 rule: str = "mean-importance") -> pd.DataFrame:
    """Why :func:`~barter_mini.core.barter.select_receiver` chose ``receiver``: per layer, its
    index, its units, whether it may receive (below ``full_width`` and holding a unit with
    statistics), its growth priority ``P_l`` under ``rule`` (the receiver is the eligible layer
    where it is highest) and its lowest pruning score (where the donors come from)."""
    return pd.DataFrame({
        "layer": range(len(counts)),
        "units": counts,
        "eligible receiver": [n < full_width and bool((s.age > 0).any()) for s, n in zip(stats, counts)],
        "growth priority": [s.growth_priority(rule) for s in stats],
        "lowest pruning score": [float(s.pruning_scores().nan_to_num(float("inf")).min()) for s in stats],
        "chosen": ["receiver" if layer == receiver else "" for layer in range(len(counts))],
    }).replace(float("inf"), float("nan"))


def unit_scores(stats: list[LayerStatistics], counts: list[int], receiver: int, donors: list[tuple[int, int]],
                parents: list[int], min_age: int) -> pd.DataFrame:
    """Why :func:`~barter_mini.core.barter.select_donors` and
    :func:`~barter_mini.core.barter.select_parents` chose ``donors`` and ``parents``: one row per
    unit with its role, layer, index, age and pruning and growth scores, each group followed by
    the unit its rule would have taken next (the same rule asked for one more), whose score
    bounds the chosen ones: no donor scores above the next donor, no parent below the next
    parent."""
    next_donor = select_donors(stats, counts, receiver, len(donors) + 1, min_age=min_age)[len(donors):]
    next_parent = select_parents(stats[receiver], min(len(parents) + 1, counts[receiver]))[len(parents):]
    units = ([("donor", layer, unit) for layer, unit in donors]
             + [("next donor (kept)", layer, unit) for layer, unit in next_donor]
             + [("parent", receiver, unit) for unit in parents]
             + [("next parent (not cloned)", receiver, unit) for unit in next_parent])
    return pd.DataFrame({
        "role": [role for role, _, _ in units],
        "layer": [layer for _, layer, _ in units],
        "unit": [unit for _, _, unit in units],
        "age (steps)": [int(stats[layer].age[unit]) for _, layer, unit in units],
        "pruning score": [float(stats[layer].pruning_scores()[unit]) for _, layer, unit in units],
        "growth score": [float(stats[layer].growth_scores()[unit]) for _, layer, unit in units],
    })


def scores_table(frame: pd.DataFrame, figures: int = SCORE_FIGURES):
    """``frame`` as a page table (:func:`~barter_mini.book.tables.page_table`) whose float
    columns show ``figures`` significant figures (scientific notation where needed)."""
    floats = [column for column in frame.columns if pd.api.types.is_float_dtype(frame[column])]
    return page_table(frame).format(f"{{:#.{figures}g}}", subset=floats, na_rep="")


def moment_norms(state_before: dict, state_after: dict, parent: int, clone: int) -> pd.DataFrame:
    """Norms of Adam's moments of a parent's row before a clone, and of the parent's and its
    clone's rows after it, beside the factors the remap applies (``alpha = 0.5``)."""
    moments = (("exp_avg", "exp_avg (first moment)"), ("exp_avg_sq", "exp_avg_sq (second moment)"))
    return pd.DataFrame({
        "tensor": [label for _, label in moments],
        "parent before": [state_before[key][parent].norm().item() for key, _ in moments],
        "parent after": [state_after[key][parent].norm().item() for key, _ in moments],
        "clone after": [state_after[key][clone].norm().item() for key, _ in moments],
        "expected factor": ["alpha = 0.5", "alpha^2 = 0.25"],
    })


def walkthrough_run(setup: Profile, density: float, seed: int) -> RunConfig:
    """The walkthrough's BARTER run: the profile's run (:func:`~barter_mini.book.experiments.profile_run`)
    on the profile's own training subset rather than the grids' smaller one."""
    return replace(profile_run(setup, "barter", density, seed), train_subset=setup.train_subset)


#: how the walkthrough's page names each entry of :data:`RUN_SUMMARY_KEYS`
RUN_SUMMARY_LABELS = {"method": "method", "model": "model", "dataset": "dataset", "density": "density rho",
                      "seed": "seed", "epochs": "epochs", "val_acc": "validation Top-1",
                      "test_acc": "test Top-1", "test_macro_f1": "test macro-F1",
                      "wall_time_s": "wall time (s)", "transfers_planned": "units planned to move",
                      "transfers_executed": "units moved", "params": "parameters",
                      "train_gflops_per_image": "training GFLOPs per image"}


def summary_table(summary: dict) -> pd.DataFrame:
    """:func:`run_summary` as the page shows it: one row per entry, named in words, the
    accuracies in percent and the transfers as heads and FFN channels."""
    def shown(key, value):
        if key in ("val_acc", "test_acc", "test_macro_f1"):
            return f"{100 * value:.2f} %"
        if isinstance(value, dict):
            return f"{value['heads']} heads, {value['ffn']} FFN channels"
        if isinstance(value, float):
            return f"{value:.4g}"
        return f"{value:,}" if isinstance(value, int) else str(value)
    return pd.DataFrame({"quantity": [RUN_SUMMARY_LABELS[key] for key in summary],
                         "value": [shown(key, value) for key, value in summary.items()]})


def run_summary(metrics: dict) -> dict:
    """The entries of a run's metrics that the walkthrough shows (:data:`RUN_SUMMARY_KEYS`)."""
    return {key: metrics[key] for key in RUN_SUMMARY_KEYS}


def _change_words(what: str, first, last) -> str:
    """``Heads per layer went from 3 / 3 to 2 / 4``, or, where the last allocation is the
    first, that they ended as they started (never "went from 3 / 3 to 3 / 3")."""
    if list(first) == list(last):
        return f"{what} ended as they started ({_per_layer(first)})"
    return f"{what} went from {_per_layer(first)} to {_per_layer(last)}"


def _per_layer(counts) -> str:
    return " / ".join(str(c) for c in counts)


def what_this_showed(update: dict, metrics: dict) -> str:
    """The chapter's conclusion as Markdown, composed from its own numbers: the update of
    section 2 (``update_step.json``: receiver, donors, parents, output changes) and the
    training run of section 3 (its metrics: accuracy, transfers, first and last allocation)."""
    donor_layers = sorted({layer for layer, _ in update["donors"]})
    first, last = metrics["allocation_history"][0], metrics["allocation_history"][-1]
    planned, executed = metrics["transfers_planned"], metrics["transfers_executed"]
    moved = " and ".join(f"{executed[kind]} of {planned[kind]} planned {label}"
                         for kind, label in (("heads", "heads"), ("ffn", "FFN channels")))
    no_heads = (" No head could move: with one head per layer the schedule plans none"
                " (K_H = 0), and no layer may give its last unit." if planned["heads"] == 0 else "")
    lines = [
        f"- **One update, four steps.** Layer {update['receiver']} had the highest growth priority and "
        f"received {len(update['parents'])} FFN channels, cloned from its units with the highest growth "
        f"scores (units {', '.join(map(str, update['parents']))}); the donors came from "
        f"layer{'s' if len(donor_layers) > 1 else ''} {', '.join(map(str, donor_layers))}, where the "
        f"pruning scores were lowest. Per layer: {_per_layer(update['ffn_before'])} became "
        f"{_per_layer(update['ffn_after'])}, the same budget.",
        f"- **A clone changes nothing; a prune changes a little.** The largest change of any logit was "
        f"{update['clone_output_change']:.1e} after cloning (float rounding: the split keeps the function) "
        f"and {update['prune_output_change']:.1e} after pruning the least useful channels.",
        f"- **Training moves capacity under fixed budgets.** The run of section 3 executed {moved}. "
        f"{_change_words('Heads per layer', first['heads'], last['heads'])}; "
        f"{_change_words('FFN channels per layer', first['ffn'], last['ffn'])}.{no_heads} It reached "
        f"{100 * metrics['val_acc']:.1f} % validation and {100 * metrics['test_acc']:.1f} % test Top-1; "
        "whether the moves beat the frozen even allocation is the question of chapter 05.",
    ]
    return "\n".join(lines)
