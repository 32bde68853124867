"""Does reallocation pay? BARTER against its own frozen allocation, run for run.

The chapter ``05_reallocation`` compares variants of the compact model that differ in one
thing each: how (or whether) they move capacity, or where they start. Every variant is
trained on the same seeds as Static, and since a seed fixes the initial weights, the data
order and the validation split, the comparison is *paired*: the difference ``variant -
static`` is taken seed by seed, and its mean and sample standard deviation say whether a
gap is larger than the seed-to-seed noise (which on the quick profile is larger than most
gaps between the variants).

Design choices are made on validation Top-1 (``val_acc``); test Top-1 is reported beside it
and never used to choose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from tqdm import tqdm

from ..errors import BarterError, check_list, choose
from ..training.cache import cached_train
from ..core.models import get_model_config
from ..training.recipes import get_recipe
from ..training.run_config import RunConfig
from .experiments import mean_std, profile_run
from .figures import CYCLE_COLORS, MAX_WIDTH_IN, stacked_panels
from .profiles import Profile
from .seed_noise import RULE, standing
from .palette import require_method_legend
from .tables import signed


@dataclass(frozen=True)
class Variant:
    """A compact method with some of BARTER's settings changed, from some start."""

    method: str
    overrides: dict = field(default_factory=dict)
    start: str = "even"
    #: start instead from the allocation the variant of this name ends with on the same seed
    allocation_from: str | None = None


#: the design choices of the paper's Figure 2 that the paper leaves open, one change each
#: from BARTER's defaults (core.barter.BarterSettings), plus the frozen allocation
DESIGN_VARIANTS: dict[str, Variant] = {
    "static": Variant("static"),
    "barter": Variant("barter"),
    "split clone moments": Variant("barter", {"clone_moments": "split"}),
    "fresh clone moments": Variant("barter", {"clone_moments": "fresh"}),
    "zero-momentum clones": Variant("barter", {"clone_moments": "zero-momentum"}),
    "warm-up clones": Variant("barter", {"clone_moments": "warmup"}),
    "no symmetry noise": Variant("barter", {"symmetry_noise": 0.0}),
    "receiver by mean pressure": Variant("barter", {"receiver_rule": "mean-pressure"}),
    "pruning by |Taylor|": Variant("barter", {"pruning_score": "taylor-abs"}),
    "pruning by Taylor^2": Variant("barter", {"pruning_score": "taylor-squared"}),
    "pruning by magnitude": Variant("barter", {"pruning_score": "magnitude"}),
    "parents by importance": Variant("barter", {"parent_score": "importance"}),
    "protection 1 step (min age 1)": Variant("barter", {"min_age": 1}),
    "split alpha 0.7": Variant("barter", {"split_alpha": 0.7}),
    "statistics EMA 0.99": Variant("barter", {"stats_beta": 0.99}),
    "update every 20 steps": Variant("barter", {"delta_t": 20}),
    "paper's transfer count (x1)": Variant("barter", {"transfer_multiplier": 1.0}),
    # the method chapter's derivation, both choices at once: the Taylor score and the exact remap
    "barter as derived": Variant("barter", {"pruning_score": "taylor-squared", "clone_moments": "split"}),
}

#: each BarterSettings.clone_moments value -> the variant that sets it
CLONE_MOMENT_VARIANTS = {"split": "split clone moments", "fresh": "fresh clone moments",
                         "zero-momentum": "zero-momentum clones", "warmup": "warm-up clones"}


def barter_defaults(setup: Profile):
    """The BarterSettings a profile's BARTER run trains with (its recipe's)."""
    return get_recipe(setup.recipe, get_model_config(setup.model).family).barter


#: the piled start (capacity piled into the first layers: poor on Fashion-MNIST) and the transfer
#: multiplier that lets BARTER move enough units to undo it
POOR_START = "first"
POOR_START_MULTIPLIER = 12.0
POOR_START_VARIANTS: dict[str, Variant] = {
    "static, piled start": Variant("static", start=POOR_START),
    "barter, piled start": Variant("barter", start=POOR_START),
    f"barter x{POOR_START_MULTIPLIER:g}, piled start": Variant(
        "barter", {"transfer_multiplier": POOR_START_MULTIPLIER}, start=POOR_START),
}

#: does the allocation BARTER finds beat the even one when trained from the start? If not,
#: moving units cannot pay on this task however cheap the moves are
FOUND_ALLOCATION_VARIANTS: dict[str, Variant] = {
    "static, from barter's end": Variant("static", allocation_from="barter"),
}

VARIANTS = {**DESIGN_VARIANTS, **POOR_START_VARIANTS, **FOUND_ALLOCATION_VARIANTS}
#: the piled-start runs the book trains (the x12 variant runs when named)
BOOK_POOR_START_VARIANTS = ("static, piled start", "barter, piled start")

#: seeds per notebook profile when the notebook is not given any: five where gaps are a few
#: tenths of a point (the seed-to-seed noise of the quick profile is ~0.8), one for smoke tests
DEFAULT_SEEDS = {"smoke": (0,), "quick": (0, 1, 2, 3, 4), "long": (0, 1, 2, 3, 4), "paper": (0, 1, 2)}
#: the long profile's design variants: the clone's optimizer state (the choice that decides
#: whether a clone becomes a unit), the receiver rule, the pruning score and the transfer
#: count; the other variants run when named (the ``variants`` parameter)
BOOK_DESIGN_VARIANTS = ("static", "barter", "split clone moments", "fresh clone moments", "zero-momentum clones",
                        "receiver by mean pressure", "pruning by Taylor^2", "paper's transfer count (x1)")
#: the quick and smoke profiles' design variants: the one choice section 2 explains (the
#: clone's moments split, against the default); the quick book stays within an hour
QUICK_DESIGN_VARIANTS = ("static", "barter", "split clone moments")
DESIGN_VARIANTS_BY_PROFILE = {"smoke": QUICK_DESIGN_VARIANTS, "quick": QUICK_DESIGN_VARIANTS,
                              "long": BOOK_DESIGN_VARIANTS, "paper": BOOK_DESIGN_VARIANTS}


def study_defaults(profile: str, seeds=(), labels=()) -> tuple[list[int], list[str]]:
    """The chapter's seeds and design variants: the ones given, else the profile's defaults."""
    choose("profile", profile, DEFAULT_SEEDS)
    seeds = check_list("seeds", seeds, "seeds", allow_empty=True) or list(DEFAULT_SEEDS[profile])
    labels = (check_list("variants", labels, "variant names", allow_empty=True)
              or list(DESIGN_VARIANTS_BY_PROFILE[profile]))
    return seeds, check_labels(labels)


def probed_labels(setup: Profile, labels) -> list[str]:
    """The variants section 2 probes: Static, BARTER at its defaults (under the name of its
    clone-moment setting) and every other clone-moment variant among ``labels``."""
    default = CLONE_MOMENT_VARIANTS[barter_defaults(setup).clone_moments]
    others = [label for label in CLONE_MOMENT_VARIANTS.values() if label in labels and label != default]
    return ["static", default, *others]


def final_allocation(metrics: dict) -> dict[str, list[int]]:
    """The per-layer heads and FFN channels a run ended with (after its last update)."""
    history = metrics.get("allocation_history")
    last = history[-1] if history else metrics["allocation"]
    return {"heads": list(last["heads"]), "ffn": list(last["ffn"])}


def variant_run(setup: Profile, variant: Variant, density: float, seed: int,
                variants: dict[str, Variant] | None = None) -> RunConfig:
    """The profile's run of ``variant`` (overrides of BARTER's settings and its start applied;
    a variant that starts where another ends trains that one first, through the run cache)."""
    run = replace(profile_run(setup, variant.method, density, seed), start=variant.start,
                  overrides=dict(variant.overrides))
    if variant.allocation_from is not None:
        source = (variants or VARIANTS)[variant.allocation_from]
        run = replace(run, allocation=final_allocation(cached_train(variant_run(setup, source, density, seed))))
    return run


def check_labels(labels, variants: dict[str, Variant] = VARIANTS) -> list[str]:
    labels = check_list("variants", labels, "variant names", allow_empty=True)
    if not labels:
        raise BarterError(f"variants must name at least one of {', '.join(variants)}")
    for label in labels:
        if not isinstance(label, str) or label not in variants:
            raise BarterError(f"unknown variant {label!r}: choose from {', '.join(variants)}")
    return labels


def run_variants(setup: Profile, labels, density: float, seeds, progress: bool = True,
                 variants: dict[str, Variant] = VARIANTS) -> pd.DataFrame:
    """Train (or read from the run cache) every variant on every seed; one row per run.

    Columns: variant, method, start, seed, validation and test Top-1 and macro-F1 (%), the
    units executed per kind and the final heads and FFN channels per layer.
    """
    labels = check_labels(labels, variants)
    rows = []
    for label, seed in tqdm([(l, s) for l in labels for s in seeds], desc="runs", disable=not progress):
        variant = variants[label]
        metrics = cached_train(variant_run(setup, variant, density, seed, variants))
        executed = metrics.get("transfers_executed") or {"heads": 0, "ffn": 0}
        rows.append({"variant": label, "method": variant.method, "start": variant.start, "seed": seed,
                     "val_acc": 100 * metrics["val_acc"], "acc": 100 * metrics["test_acc"],
                     "val_f1": 100 * metrics["val_macro_f1"], "f1": 100 * metrics["test_macro_f1"],
                     "heads_moved": executed["heads"], "ffn_moved": executed["ffn"],
                     "heads": tuple(metrics["allocation"]["heads"]), "ffn": tuple(metrics["allocation"]["ffn"])})
    return pd.DataFrame(rows)


def paired_against(runs: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Per variant: mean +- sample std of validation and test Top-1 (%), and the paired
    difference ``variant - reference`` over the seeds both have (mean +- sample std, points),
    with the number of seeds on which the variant's validation Top-1 is above the reference's.

    A paired difference within the seed noise (:func:`~barter_mini.book.seed_noise.standing`)
    is not a difference these seeds can see.
    """
    if reference not in set(runs["variant"]):
        raise BarterError(f"the paired table needs the reference {reference!r} among the runs")
    base = runs[runs["variant"] == reference].set_index("seed")
    rows = []
    for label, own in runs.groupby("variant", sort=False):
        own = own.set_index("seed")
        seeds = own.index.intersection(base.index)
        val_diff = own.loc[seeds, "val_acc"] - base.loc[seeds, "val_acc"]
        test_diff = own.loc[seeds, "acc"] - base.loc[seeds, "acc"]
        rows.append({"variant": label, "seeds": len(own),
                     "val_mean": own["val_acc"].mean(), "val_std": own["val_acc"].std(),
                     "test_mean": own["acc"].mean(), "test_std": own["acc"].std(),
                     "val_diff_mean": val_diff.mean(), "val_diff_std": val_diff.std(),
                     "test_diff_mean": test_diff.mean(), "test_diff_std": test_diff.std(),
                     "val_wins": int((val_diff > 0).sum()), "paired_seeds": len(seeds)})
    return pd.DataFrame(rows)


def paired_table(paired: pd.DataFrame, reference: str) -> pd.DataFrame:
    """:func:`paired_against` as a page shows it: ``mean ± std`` cells."""
    return pd.DataFrame({
        "variant": paired["variant"], "seeds": paired["seeds"],
        "validation Top-1 (%)": [mean_std(m, s) for m, s in zip(paired["val_mean"], paired["val_std"])],
        "test Top-1 (%)": [mean_std(m, s) for m, s in zip(paired["test_mean"], paired["test_std"])],
        f"validation minus {reference} (points)": [mean_std(m, s) for m, s in
                                                   zip(paired["val_diff_mean"], paired["val_diff_std"])],
        f"test minus {reference} (points)": [mean_std(m, s) for m, s in
                                             zip(paired["test_diff_mean"], paired["test_diff_std"])],
        "seeds above on validation": [f"{w} of {n}" for w, n in zip(paired["val_wins"], paired["paired_seeds"])],
    })


def _paired_gap(paired: pd.DataFrame, variant: str) -> tuple[float, float, int]:
    row = paired.set_index("variant").loc[variant]
    n = int(row["paired_seeds"])
    error = row["val_diff_std"] / n ** 0.5 if n > 1 and not pd.isna(row["val_diff_std"]) else math.inf
    return float(row["val_diff_mean"]), error, n


def _side(mean: float, error: float) -> str:
    return {"ahead": "above", "behind": "below"}.get(standing(mean, error), "level with")


def verdict(paired: pd.DataFrame, variant: str, reference: str) -> str:
    """One sentence, from the numbers: is ``variant`` above, below or level with ``reference``
    on validation Top-1, paired by seed, beyond the seed noise? The two labels are set
    in backticks, so that a label such as ``static, piled start`` reads as one name."""
    choose("variant", variant, set(paired["variant"]))
    row = paired.set_index("variant").loc[variant]
    mean, error, n = _paired_gap(paired, variant)
    std = row["val_diff_std"]
    if math.isinf(error):
        return (f"`{variant}` minus `{reference}`: {signed(mean)} points of validation Top-1 on one seed; "
                "one seed cannot tell a difference from noise.")
    side = _side(mean, error)
    within = f" (within {RULE})" if side == "level with" else ""
    return (f"`{variant}` is {side} `{reference}`{within}: {signed(mean)} ± {std:.2f} points of validation Top-1 "
            f"paired over {n} seeds (standard error {error:.2f}; above on {int(row['val_wins'])} of {n}); "
            f"test: {signed(row['test_diff_mean'])} ± {row['test_diff_std']:.2f}.")


# ----------------------------------------------------------------------------- probes

def update_costs(probe: dict) -> pd.DataFrame:
    """One row per probed update and unit kind of a :func:`barter_mini.measure.reallocation.probe_run` result:
    units moved, receiver, and the change of probe loss (validation images) caused by the prune
    part alone, by the clone part alone (with the run's symmetry noise and exact), by the
    whole update, and 20 steps later, with the clone's largest relative logit change in
    millionths (1e-6), with the run's symmetry noise and without."""
    rows = []
    for update in probe["probe"]["updates"]:
        before = update["before"]["loss"]
        later = update.get("later", {}).get("20", {}).get("loss")
        for kind, part in update["kinds"].items():
            rows.append({"step": update["step"], "kind": kind, "units": part["units"], "receiver": part["receiver"],
                         "prune": part["after_prune"]["loss"] - before,
                         "clone": part["after_clone"]["loss"] - before,
                         "exact clone": part["after_exact_clone"]["loss"] - before,
                         "whole update": update["after"]["loss"] - before,
                         "20 steps later": (later - before) if later is not None else float("nan"),
                         "clone logit change (1e-6)": 1e6 * part["after_clone_logit_change"],
                         "exact clone logit change (1e-6)": 1e6 * part["after_exact_clone_logit_change"]})
    return pd.DataFrame(rows)


def clone_divergence(probe: dict) -> pd.DataFrame:
    """Mean ``||w_clone - w_parent|| / ||w_parent||`` per unit kind, 1, 5 and 20 steps after
    the updates: a pair whose distance stays where the symmetry noise put it moves in
    lockstep and adds no capacity."""
    rows = [{"kind": pairs["kind"], "after steps": int(steps), "distance": distance}
            for pairs in probe["probe"]["clone_distances"] for steps, distance in pairs["distance"].items()]
    if not rows:
        return pd.DataFrame(columns=["kind", "after steps", "distance"])
    return pd.DataFrame(rows).groupby(["kind", "after steps"], as_index=False)["distance"].mean()


def importance_frame(probes: dict[str, dict], kind: str) -> pd.DataFrame:
    """Per probed run (label), update step and layer: the mean (``priority``) and the total
    Taylor importance of the layer's units of ``kind``, as the probe's observing hooks saw them."""
    choose("kind", kind, ("heads", "ffn"))
    rows = []
    for label, probe in probes.items():
        for point in probe["probe"]["importance"]:
            for layer, (priority, total) in enumerate(zip(point[kind]["priority"], point[kind]["total"])):
                rows.append({"run": label, "step": point["step"], "layer": layer,
                             "priority": priority, "total": total})
    return pd.DataFrame(rows)


def plot_paired(runs: pd.DataFrame, reference: str, labels=None):
    """Validation Top-1 per seed: one line per variant across seeds, the reference in black."""
    labels = list(labels) if labels is not None else list(dict.fromkeys(runs["variant"]))
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN, 3.6), constrained_layout=True)
    others = iter(CYCLE_COLORS)
    for label in labels:
        own = runs[runs["variant"] == label].sort_values("seed")
        style = ({"color": "black", "lw": 2.2} if label == reference else
                 {"color": next(others), "lw": 1.2, "alpha": 0.85})
        ax.plot(own["seed"], own["val_acc"], marker="o", label=label, **style)
    ax.set_xlabel("seed")
    ax.set_ylabel("validation Top-1 (%)")
    ax.set_xticks(sorted(set(runs["seed"])))
    ax.legend(fontsize="small", ncols=2)
    require_method_legend(fig)
    return fig


def plot_importance(frame: pd.DataFrame, value: str = "total", title: str = ""):
    """``value`` ("priority" or "total") per layer over the update steps, one panel per run."""
    choose("value", value, ("priority", "total"))
    runs = list(dict.fromkeys(frame["run"]))
    fig, axes = stacked_panels(len(runs), 2.4, legend_in=0.5, sharex=True, sharey=True)
    for ax, run in zip(axes, runs):
        own = frame[frame["run"] == run]
        layers = own.groupby("layer")
        for (layer, points), color in zip(layers, sns.color_palette("colorblind", layers.ngroups)):
            ax.plot(points["step"], points[value], color=color, label=f"layer {layer}")
        ax.set_title(run)
        ax.set_yscale("log")
        ax.set_ylabel("mean Taylor importance" if value == "priority" else "total Taylor importance")
    axes[-1].set_xlabel("step")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)), frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def plain_summary(headline: pd.DataFrame, found: pd.DataFrame, poor: pd.DataFrame) -> str:
    """The chapter's answer in plain words, composed from its three paired tables
    (:func:`paired_against` of the headline runs and the found-allocation runs against
    ``static``, and of the piled-start runs against ``static, piled start``)."""
    barter, barter_error, n = _paired_gap(headline, "barter")
    if n < 2:
        return ("On one seed no difference here can be told from the seed-to-seed noise: rerun this "
                "chapter with five seeds or more (the quick profile's default) before reading an answer into it.")
    found_gap, found_error, _ = _paired_gap(found, "static, from barter's end")
    cost, _, _ = _paired_gap(poor, "static")
    repair, repair_error, _ = _paired_gap(poor, "barter, piled start")
    lines = [f"At the even start BARTER is {_side(barter, barter_error)} Static ({signed(barter)} points of "
             f"validation Top-1, paired over {n} seeds)."]
    if _side(found_gap, found_error) != "above":
        lines.append(f"Static trained from the allocation BARTER ends with is {_side(found_gap, found_error)} "
                     f"the even Static ({signed(found_gap)}): the allocation the updates move towards is no better "
                     "a network to train than the even one, so moving units cannot pay here, and what the "
                     "moves cost (section 2) is a net loss or, at best, no gain.")
    else:
        lines.append(f"Static trained from the allocation BARTER ends with is above the even Static "
                     f"({signed(found_gap)}): the updates find a better allocation, and BARTER's own gap is what "
                     "it keeps of it after paying for the moves on the way there (section 2).")
    # a negative worth reads as a riddle: say which start is the better one
    better = (f"the even start is worth {signed(cost)} points to Static over the piled one" if cost >= 0 else
              f"the piled start is worth {signed(-cost)} points to Static over the even one")
    lines.append(f"How much the allocation matters at all: {better}, and from the piled start BARTER is "
                 f"{_side(repair, repair_error)} Static ({signed(repair)}).")
    return " ".join(lines)
