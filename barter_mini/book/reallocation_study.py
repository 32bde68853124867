"""The variants of chapter 05 (does reallocation pay?) and the runs that train them.

Each variant of the compact model differs from BARTER in one thing: how (or whether) it moves
capacity, or where it starts. The chapter, the book's run plan and the sweep name them here
(:data:`VARIANTS`) and build their runs with :func:`variant_run`; the chapter pairs them with
Static by seed, computes the gaps and draws them in its own cells.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import BarterError, check_list, choose
from ..core.models import get_model_config
from ..training.recipes import get_recipe
from ..training.run_config import RunConfig
from .experiments import profile_run
from .profiles import Profile


@dataclass(frozen=True)
class Variant:
    """A compact method with some of BARTER's settings changed, from some start."""

    method: str
    #: BARTER's settings this variant changes, by name (applied with
    #: :meth:`~barter_mini.training.run_config.RunConfig.with_method_settings`)
    changes: dict = field(default_factory=dict)
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

#: every variant the chapter can train, by label
VARIANTS = {**DESIGN_VARIANTS, **POOR_START_VARIANTS, **FOUND_ALLOCATION_VARIANTS}
#: the piled-start runs the book trains (the x12 variant runs when named)
BOOK_POOR_START_VARIANTS = ("static, piled start", "barter, piled start")

#: seeds per notebook profile when the notebook is not given any: the quick book's live slice
#: (three: its conclusions rest on the recorded map, 5-10 seeds a cell), five on long, one on smoke
DEFAULT_SEEDS = {"smoke": (0,), "quick": (0, 1, 2), "long": (0, 1, 2, 3, 4), "paper": (0, 1, 2)}
#: the long profile's design variants: the clone's optimizer state (the choice that decides
#: whether a clone becomes a unit), the receiver rule, the pruning score and the transfer
#: count; the other variants run when named (the ``variants`` parameter)
BOOK_DESIGN_VARIANTS = ("static", "barter", "split clone moments", "fresh clone moments", "zero-momentum clones",
                        "receiver by mean pressure", "pruning by Taylor^2", "paper's transfer count (x1)")
#: the quick and smoke profiles' design variants: the one choice section 2 explains (the
#: clone's moments split, against the default); the quick book stays within 45 minutes
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


def final_allocation(metrics: dict) -> dict[str, list[int]]:
    """The per-layer heads and FFN channels a run ended with (after its last update)."""
    history = metrics.get("allocation_history")
    last = history[-1] if history else metrics["allocation"]
    return {"heads": list(last["heads"]), "ffn": list(last["ffn"])}


def variant_run(setup: Profile, variant: Variant, density: float, seed: int,
                variants: dict[str, Variant] | None = None) -> RunConfig:
    """The profile's run of ``variant`` (its changes of BARTER's settings and its start applied;
    a variant that starts where another ends trains that one first, through the run cache)."""
    run = replace(profile_run(setup, variant.method, density, seed), start=variant.start)
    if variant.changes:
        run = run.with_method_settings(**variant.changes)
    if variant.allocation_from is not None:
        source = (variants or VARIANTS)[variant.allocation_from]
        run = replace(run, allocation=final_allocation(setup.cached_train(variant_run(setup, source, density, seed))))
    return run


def check_labels(labels, variants: dict[str, Variant] = VARIANTS) -> list[str]:
    """``labels`` if each names a variant, else a one-line error listing the names."""
    labels = check_list("variants", labels, "variant names", allow_empty=True)
    if not labels:
        raise BarterError(f"variants must name at least one of {', '.join(variants)}")
    for label in labels:
        if not isinstance(label, str) or label not in variants:
            raise BarterError(f"unknown variant {label!r}: choose from {', '.join(variants)}")
    return labels
