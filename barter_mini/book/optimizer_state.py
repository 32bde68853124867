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

import pandas as pd
import seaborn as sns
from tqdm import tqdm

from ..core.barter import BarterSettings
from ..errors import BarterError, check_list
from ..masked.base import MaskedSettings
from ..training.cache import cached_train
from ..training.run_config import RunConfig
from ..training.trainer import UPDATE_WINDOW
from .experiments import mean_std, profile_run
from .profiles import Profile
from .seed_noise import RULE, beyond_noise
from .figures import stacked_panels
from .palette import require_method_legend
from .tables import signed

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
#: each method's default policy, the one the others are measured against
DEFAULT_POLICIES = {"barter": BarterSettings.clone_moments, "rigl": MaskedSettings.regrow_moments}


#: small counts as the legends write them
_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")


def _steps(n: int) -> str:
    """``ten steps``, ``one step``; digits above twelve."""
    return f"{_WORDS[n] if 0 <= n < len(_WORDS) else f'{n:,}'} step{'' if n == 1 else 's'}"


def runs_legend() -> str:
    """The legend of chapter 07's table of runs, as Markdown, with the windows the code uses:
    :data:`SPIKE_STEPS` after an update, :data:`~barter_mini.training.trainer.UPDATE_WINDOW`
    before it."""
    return ("One row per run: validation and test Top-1 (%), the number of updates, the mean change of the "
            f"training loss over the {_steps(SPIKE_STEPS)} after an update (relative to the "
            f"{_steps(UPDATE_WINDOW)} before it; positive: a spike), and the heads and FFN channels the run "
            "moved between layers.")


def figure_legend() -> str:
    """The legend of chapter 07's figure (:func:`plot_loss_around_updates`), as Markdown: the
    steps it shows are the :data:`~barter_mini.training.trainer.UPDATE_WINDOW` steps a run
    records on either side of an update."""
    return (f"Training loss minus its mean over the {_steps(UPDATE_WINDOW)} before the update, at each step "
            f"from {1 - UPDATE_WINDOW} to {UPDATE_WINDOW} (step 0 is the last one before the update, which "
            "happens between step 0 and step 1), one line per policy. A cold start shows as a rise right "
            "after the line.")


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
    Top-1 (%), the number of updates, the mean loss change over the :data:`SPIKE_STEPS` steps
    after an update, averaged over the run's updates, and the heads and FFN channels the run
    moved between layers), and per run, offset the mean loss change over its updates.
    """
    pairs = check_policies(labels)
    runs, changes = [], []
    for (method, policy), seed in tqdm([(p, s) for p in pairs for s in seeds], desc="runs", disable=not progress):
        metrics = cached_train(policy_run(setup, method, policy, density, seed))
        change = loss_changes(metrics)
        per_offset = change.groupby("offset", as_index=False)["change"].mean()
        spike = per_offset[(per_offset["offset"] >= 1) & (per_offset["offset"] <= SPIKE_STEPS)]["change"].mean()
        moved = metrics.get("transfers_executed") or {"heads": 0, "ffn": 0}
        runs.append({"method": method, "policy": policy, "seed": seed, "val_acc": 100 * metrics["val_acc"],
                     "acc": 100 * metrics["test_acc"], "updates": change["update"].nunique(), "spike": spike,
                     "head_transfers": moved["heads"], "ffn_transfers": moved["ffn"]})
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
    method (stacked) and one line per policy, each policy in its own colour and line style
    (mean over updates and seeds)."""
    methods = list(dict.fromkeys(changes["method"]))
    policies = list(dict.fromkeys(changes["policy"]))
    colors = dict(zip(policies, sns.color_palette("colorblind", len(policies))))
    fig, axes = stacked_panels(len(methods), 2.6, sharex=True)
    styles = ["-", "--", ":", "-."]
    for ax, method in zip(axes, methods):
        own = changes[changes["method"] == method]
        for style, (policy, rows) in zip(styles, own.groupby("policy", sort=False)):
            mean = rows.groupby("offset")["change"].mean()
            ax.plot(mean.index, mean.values, style, marker="o", ms=3, color=colors[policy],
                    label=f"{method}, {policy}")
        ax.axvline(0.5, color="0.6", lw=1)
        ax.axhline(0.0, color="0.8", lw=1)
        ax.set_ylabel("loss minus before")
        ax.set_title(method)
        ax.legend(fontsize="small", title="new units' optimizer state", loc="center left",
                  bbox_to_anchor=(1.01, 0.5), frameon=False)
    axes[-1].set_xlabel("optimizer steps from the update (the update follows step 0)")
    require_method_legend(fig)
    return fig


def _paired_with_default(runs: pd.DataFrame, method: str, policy: str) -> pd.Series:
    """``policy``'s validation Top-1 minus its method's default policy's, seed by seed (the
    seeds both have)."""
    def by_seed(chosen: str) -> pd.Series:
        return runs[(runs["method"] == method) & (runs["policy"] == chosen)].set_index("seed")["val_acc"]
    own, default = by_seed(policy), by_seed(DEFAULT_POLICIES[method])
    seeds = own.index.intersection(default.index)
    return own.loc[seeds] - default.loc[seeds]


def _against_defaults(runs: pd.DataFrame) -> list[tuple[str, str, pd.Series]]:
    """``(method, policy, validation Top-1 minus the default's, seed by seed)`` for every
    policy other than its method's default, where the default ran on some of its seeds."""
    compared = []
    for method, policy in dict.fromkeys(zip(runs["method"], runs["policy"])):
        default = DEFAULT_POLICIES.get(method)
        if policy == default or not ((runs["method"] == method) & (runs["policy"] == default)).any():
            continue
        diff = _paired_with_default(runs, method, policy)
        if not diff.empty:
            compared.append((method, policy, diff))
    return compared


def _above_beyond_noise(diff: pd.Series) -> bool:
    """Above zero beyond the seed noise (:func:`~barter_mini.book.seed_noise.beyond_noise`)."""
    return bool(diff.mean() > 0 and beyond_noise(diff.mean(), diff.std(), len(diff)))


def reading_the_results(runs: pd.DataFrame) -> str:
    """Chapter 07's conclusion as Markdown bullets, composed from its runs
    (:func:`run_policies`), so it states the page's own numbers:

    * the cold start: per method and policy, the mean loss change over the
      :data:`SPIKE_STEPS` steps after an update (positive: the loss rose, SMET's spike);
    * each other policy against its method's default (:data:`DEFAULT_POLICIES`): validation
      Top-1 paired by seed, mean ± sample std, and whether the mean is beyond the seed noise
      (:func:`~barter_mini.book.seed_noise.beyond_noise`, the book's one rule);
    * how many units a BARTER update moved, the size SMET's spikes depend on.
    """
    seeds = int(runs["seed"].nunique())
    spikes = runs.groupby(["method", "policy"], sort=False)["spike"].mean()
    per_method = "; ".join(
        f"{method} " + ", ".join(f"{spike:+.3f} (`{policy}`)" for (m, policy), spike in spikes.items() if m == method)
        for method in dict.fromkeys(spikes.index.get_level_values("method")))
    rose = [f"{method}/{policy}" for (method, policy), spike in spikes.items() if spike > 0]
    line = (f"**The cold start.** Over the {SPIKE_STEPS} steps after an update the training loss changed, "
            f"against its mean over the steps before it, by {per_method} (mean over the updates of "
            f"{seeds} seed{'s' if seeds > 1 else ''}). ")
    line += (f"It rose under {', '.join(f'`{label}`' for label in rose)}: a cold start, SMET's spike."
             if rose else "It fell under every policy: there is no cold start to cure here.")
    lines = [line]
    gaps, beyond = [], []
    for method, policy, diff in _against_defaults(runs):
        spread = f" ± {diff.std():.2f}" if len(diff) > 1 else ""
        gaps.append(f"{method} `{policy}` {signed(diff.mean())}{spread} points against `{DEFAULT_POLICIES[method]}`")
        if _above_beyond_noise(diff):
            beyond.append(f"{method} `{policy}`")
    if gaps:
        lines.append("**Accuracy against the default.** Validation Top-1, paired by seed: " + "; ".join(gaps) + ".")
        if seeds < 2:
            lines.append("One seed cannot tell a policy's gain from the seed-to-seed noise: pass five "
                         "(`-y \"seeds: [0, 1, 2, 3, 4]\"`) before reading a direction into these numbers.")
        elif beyond:
            lines.append(f"Above its default beyond the seed noise ({RULE}): {', '.join(beyond)}; a case "
                         "to confirm on more seeds before a default changes.")
        else:
            lines.append(f"No policy is above its method's default beyond the seed noise ({RULE}), so nothing "
                         "here argues for changing the defaults ("
                         + ", ".join(f"`{policy}` for {method}" for method, policy in DEFAULT_POLICIES.items())
                         + ").")
    barter = runs[(runs["method"] == "barter") & (runs["updates"] > 0)]
    if not barter.empty and {"head_transfers", "ffn_transfers"} <= set(barter.columns):
        heads = (barter["head_transfers"] / barter["updates"]).mean()
        ffn = (barter["ffn_transfers"] / barter["updates"]).mean()
        lines.append(f"**The size of an update.** A BARTER update here moved {heads:.1f} heads and {ffn:.1f} FFN "
                     "channels on average. SMET's spikes come from large sparse models whose new weights are a "
                     "large share of a tensor: rerun the chapter at a low density or on the `paper` profile to "
                     "see whether the spike appears when updates are larger.")
    return "\n".join(f"* {line}" for line in lines)


def headline(runs: pd.DataFrame) -> str:
    """Chapter 07's answer in one sentence for the introduction, from the same runs as
    :func:`reading_the_results`: whether the loss rose after an update under any policy (a
    cold start) and whether any policy beat its method's default beyond the seed noise."""
    seeds = int(runs["seed"].nunique())
    spikes = runs.groupby(["method", "policy"], sort=False)["spike"].mean()
    rose = [f"`{method}/{policy}`" for (method, policy), spike in spikes.items() if spike > 0]
    cold = (f"the loss rose just after an update under {', '.join(rose)}: a cold start" if rose else
            "the loss just after an update was lower than before it under every policy: no cold start to cure")
    beyond = [f"`{method}/{policy}`" for method, policy, diff in _against_defaults(runs) if _above_beyond_noise(diff)]
    if seeds < 2:
        verdict = "one seed cannot say whether any policy beats the defaults"
    elif beyond:
        verdict = (f"{beyond[0]} beat its method's default" if len(beyond) == 1 else
                   f"{', '.join(beyond)} each beat their method's default") + " beyond the seed noise"
    else:
        verdict = "no policy beat its method's default beyond the seed noise"
    return f"Over {seeds} seed{'s' if seeds > 1 else ''}, {cold}; {verdict}."
