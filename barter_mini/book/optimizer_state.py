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

A run records the training loss of the ``UPDATE_WINDOW`` steps before and after every update
(``update_losses`` in metrics.json). The loss *change* after an update is measured against
the mean loss of the steps just before it, which takes out the slow downward drift of
training; averaged over a run's updates and then over seeds.
"""

from __future__ import annotations

from dataclasses import replace

import matplotlib.pyplot as plt
import pandas as pd
from tqdm import tqdm

from ..errors import BarterError, check_list
from ..training.cache import cached_train
from ..training.run_config import RunConfig
from .experiments import mean_std, profile_run
from .profiles import Profile
from .report import METHOD_PALETTE

#: (method, policy) -> the settings that choose the policy
POLICIES: dict[tuple[str, str], dict] = {
    ("barter", "split"): {"clone_moments": "split"},
    ("barter", "fresh"): {"clone_moments": "fresh"},
    ("barter", "warmup"): {"clone_moments": "warmup"},
    ("rigl", "reset"): {"regrow_moments": "reset"},
    ("rigl", "warmup"): {"regrow_moments": "warmup"},
}
#: steps after an update whose mean loss change is a run's "spike"
SPIKE_STEPS = 3


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


def loss_changes(metrics: dict) -> pd.DataFrame:
    """One row per update and step offset (-window+1 .. window, 0 the update's own step):
    the training loss minus the mean loss of the steps up to the update."""
    rows = []
    for update in metrics["update_losses"]:
        before, after = update["before"], update["after"]
        if not before:
            continue
        baseline = sum(before) / len(before)
        rows += [{"update": update["step"], "offset": offset, "change": loss - baseline}
                 for offset, loss in zip(range(1 - len(before), 1 + len(after)), before + after)]
    return pd.DataFrame(rows, columns=["update", "offset", "change"])


def policy_run(setup: Profile, method: str, policy: str, density: float, seed: int) -> RunConfig:
    """The profile's run of ``method`` with its new units' optimizer state set to ``policy``."""
    return replace(profile_run(setup, method, density, seed), overrides=dict(POLICIES[method, policy]))


def run_policies(setup: Profile, labels, density: float, seeds, progress: bool = True):
    """Train (or read from the cache) every policy on every seed.

    Returns ``(runs, changes)``: one row per run (method, policy, seed, validation and test
    Top-1 (%), the mean loss change over the :data:`SPIKE_STEPS` steps after an update,
    averaged over the run's updates), and per run, offset the mean loss change over its updates.
    """
    pairs = check_policies(labels)
    runs, changes = [], []
    for (method, policy), seed in tqdm([(p, s) for p in pairs for s in seeds], desc="runs", disable=not progress):
        metrics = cached_train(policy_run(setup, method, policy, density, seed))
        change = loss_changes(metrics)
        per_offset = change.groupby("offset", as_index=False)["change"].mean()
        spike = per_offset[(per_offset["offset"] >= 1) & (per_offset["offset"] <= SPIKE_STEPS)]["change"].mean()
        runs.append({"method": method, "policy": policy, "seed": seed, "val_acc": 100 * metrics["val_acc"],
                     "acc": 100 * metrics["test_acc"], "updates": change["update"].nunique(), "spike": spike})
        changes.append(per_offset.assign(method=method, policy=policy, seed=seed))
    return pd.DataFrame(runs), pd.concat(changes, ignore_index=True)


def policy_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per method and policy: test and validation Top-1 (%) and the loss change right after
    an update, mean ± sample std over seeds."""
    rows = []
    for (method, policy), own in runs.groupby(["method", "policy"], sort=False):
        rows.append({"method": method, "policy": policy, "seeds": len(own),
                     "validation Top-1 (%)": mean_std(own["val_acc"].mean(), own["val_acc"].std()),
                     "test Top-1 (%)": mean_std(own["acc"].mean(), own["acc"].std()),
                     f"loss change, {SPIKE_STEPS} steps after an update": f"{own['spike'].mean():+.4f}"
                     + ("" if len(own) < 2 else f" ± {own['spike'].std():.4f}"),
                     "updates per run": own["updates"].mean()})
    return pd.DataFrame(rows)


def plot_loss_around_updates(changes: pd.DataFrame):
    """The training loss around an update, relative to the steps before it, one panel per
    method and one line per policy (mean over updates and seeds)."""
    methods = list(dict.fromkeys(changes["method"]))
    fig, axes = plt.subplots(1, len(methods), figsize=(6.2 * len(methods), 3.6), constrained_layout=True,
                             squeeze=False)
    styles = ["-", "--", ":", "-."]
    for ax, method in zip(axes[0], methods):
        own = changes[changes["method"] == method]
        for style, (policy, rows) in zip(styles, own.groupby("policy", sort=False)):
            mean = rows.groupby("offset")["change"].mean()
            ax.plot(mean.index, mean.values, style, marker="o", ms=3, color=METHOD_PALETTE[method], label=policy)
        ax.axvline(0.5, color="0.6", lw=1)
        ax.axhline(0.0, color="0.8", lw=1)
        ax.set_xlabel("optimizer steps from the update (the update follows step 0)")
        ax.set_ylabel("training loss minus the mean before the update")
        ax.set_title(method)
        ax.legend(fontsize="small", title="new units' optimizer state")
    return fig
