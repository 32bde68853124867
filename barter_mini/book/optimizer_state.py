"""What a new unit's optimizer state should be: the loss right after every update, per policy.

SMET reports a *cold start* in dynamic sparse training with Adam: a parameter born with
zeroed moments while its tensor's step count is late takes a first step of about
``lr * (1 - beta1) / sqrt(1 - beta2)``, some 3x a warmed-up one's, and the loss spikes after
topology updates. BARTER's clones and the masked methods' regrown weights are born at every
update, so each method has a policy (:data:`POLICIES`):

* BARTER (``BarterSettings.clone_moments``): ``split`` (the exact remap: the clone continues
  its parent's moments, split consistently), ``fresh`` (zeroed: the cold start, BARTER's
  default, chosen on validation in chapter 05) and ``warmup`` (zeroed, the updates ramped
  in: :mod:`barter_mini.core.warmup`);
* RigL (``MaskedSettings.regrow_moments``): ``reset`` (zeroed, the RigL convention) and
  ``warmup``.

A run records the training loss of the
:data:`~barter_mini.training.trainer.UPDATE_WINDOW` steps before and after every update
(``update_losses`` in metrics.json). The loss *change* after an update is measured against
the mean loss of the steps just before it (:func:`loss_changes`), averaged over a run's
updates. The measure has no control: the training loss falls whether or not an update
happens, so only a comparison of two policies paired by seed cancels that drift. Chapter 07
reads the table :func:`run_policies` makes and draws its figure in its own cells; the sweep
and the recorded grid (``data/policies_grid.csv``) use the functions here.
"""

from __future__ import annotations


import pandas as pd
from tqdm import tqdm

from ..core.barter import BarterSettings
from ..errors import BarterError, check_list
from ..masked.base import MaskedSettings
from ..training.run_config import RunConfig
from .experiments import profile_run
from .profiles import Profile

#: (method, policy) -> the settings that choose the policy
POLICIES: dict[tuple[str, str], dict] = {
    ("barter", "split"): {"clone_moments": "split"},
    ("barter", "fresh"): {"clone_moments": "fresh"},
    ("barter", "warmup"): {"clone_moments": "warmup"},
    ("rigl", "reset"): {"regrow_moments": "reset"},
    ("rigl", "warmup"): {"regrow_moments": "warmup"},
}
#: the windows a run keeps (metrics.json key), by what they are around: the updates, and the
#: control halfway between them
WINDOWS = {"update": "update_losses", "control": "control_losses"}
#: steps after an update whose mean loss change is a run's "spike"
SPIKE_STEPS = 3
#: each method's default policy, the one the others are measured against
DEFAULT_POLICIES = {"barter": BarterSettings.clone_moments, "rigl": MaskedSettings.regrow_moments}


def check_policies(labels) -> list[tuple[str, str]]:
    """``"barter/fresh"``-style labels as (method, policy) pairs; a one-line error otherwise."""
    known = [f"{m}/{p}" for m, p in POLICIES]
    pairs = []
    for label in check_list("policies", labels, "method/policy labels", allow_empty=True):
        if label not in known:
            raise BarterError(f"unknown policy {label!r}: choose from {', '.join(known)}")
        pairs.append(tuple(label.split("/")))
    if not pairs:
        raise BarterError(f"policies must name at least one of {', '.join(known)}")
    return pairs


def loss_changes(metrics: dict, windows: str = "update_losses") -> pd.DataFrame:
    """One row per update and step offset (-window+1 .. window, 0 the update's own step):
    the training loss minus the mean loss of the steps up to the update. ``windows=
    "control_losses"``: the same around the steps halfway between updates, where nothing
    changed the model (none in a run trained before the trainer kept them)."""
    rows = []
    for update in metrics.get(windows, []):
        before, after = update["before"], update["after"]
        if not before:
            continue
        baseline = sum(before) / len(before)
        rows += [{"update": update["step"], "offset": offset, "change": loss - baseline}
                 for offset, loss in zip(range(1 - len(before), 1 + len(after)), before + after)]
    return pd.DataFrame(rows, columns=["update", "offset", "change"])


def policy_run(setup: Profile, method: str, policy: str, density: float, seed: int) -> RunConfig:
    """The profile's run of ``method`` with its new units' optimizer state set to ``policy``."""
    return profile_run(setup, method, density, seed).with_method_settings(**POLICIES[method, policy])


def run_policies(setup: Profile, labels, density: float, seeds, progress: bool = True):
    """Train (or read from the cache) every policy on every seed.

    Returns ``(runs, changes)``: one row per run (method, policy, seed, validation and test
    Top-1 (%), the number of updates, the mean loss change over the :data:`SPIKE_STEPS` steps
    after an update, averaged over the run's updates (``spike``), the same halfway between
    updates (``control``: the drift of training alone), and the heads and FFN channels the run
    moved between layers), and per run, offset and ``around`` ("update", or "control" for
    the windows halfway between updates) the mean loss change over the run's windows.
    """
    pairs = check_policies(labels)
    runs, changes = [], []
    for (method, policy), seed in tqdm([(p, s) for p in pairs for s in seeds], desc="runs", disable=not progress):
        metrics = setup.cached_train(policy_run(setup, method, policy, density, seed))
        windows = {around: loss_changes(metrics, key) for around, key in WINDOWS.items()}
        after = {}
        for around, change in windows.items():
            per_offset = change.groupby("offset", as_index=False)["change"].mean()
            after[around] = per_offset[per_offset["offset"].between(1, SPIKE_STEPS)]["change"].mean()
            changes.append(per_offset.assign(method=method, policy=policy, seed=seed, around=around))
        moved = metrics.get("transfers_executed") or {"heads": 0, "ffn": 0}
        runs.append({"method": method, "policy": policy, "seed": seed, "val_acc": 100 * metrics["val_acc"],
                     "acc": 100 * metrics["test_acc"], "updates": windows["update"]["update"].nunique(), "spike": after["update"],
                     "control": after["control"], "head_transfers": moved["heads"], "ffn_transfers": moved["ffn"]})
    return pd.DataFrame(runs), pd.concat(changes, ignore_index=True)
