"""How many units to move: BARTER at 1x, 2x, 4x and 6x the paper's transfers (Tables 16, 17).

Table 3 fixes how many heads and FFN channels BARTER moves over a schedule (``K_H``, ``K_C``);
Table 16 trains ViT/Tiny-ImageNet at rho = 0.5 with that count multiplied, and Table 17
gives what the extra updates cost. Here each multiplier is a BARTER run of the profile
(``RunConfig.transfer_multiplier`` scales the paper's count, whatever the profile's recipe
uses), with its planned and executed transfers, Top-1 and macro-F1, and the wall time its
topology updates took inside the run (``update_time_s`` in metrics.json: every
``after_step`` that changed the model, so the statistics' bookkeeping between updates is
not in it), per training step and over the schedule. Chapter 08 reads the table
:func:`run_multipliers` makes and sets it beside the paper in its own cells; the sweep and
the recorded grid (``data/multipliers_grid.csv``) use the functions here.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
from tqdm import tqdm

from ..errors import BarterError, check_in_range, check_list
from ..training.run_config import RunConfig
from .experiments import profile_run
from .profiles import Profile


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
        metrics = setup.cached_train(multiplier_run(setup, multiplier, density, seed))
        planned, executed = metrics["transfers_planned"], metrics["transfers_executed"]
        rows.append({"multiplier": multiplier, "seed": seed, "heads_planned": planned["heads"],
                     "ffn_planned": planned["ffn"], "head_transfers": executed["heads"],
                     "ffn_transfers": executed["ffn"], "val_acc": 100 * metrics["val_acc"],
                     "acc": 100 * metrics["test_acc"], "f1": 100 * metrics["test_macro_f1"],
                     "update_ms_per_step": metrics["update_ms_per_step"],
                     "update_s_per_schedule": metrics["update_time_s"]})
    return pd.DataFrame(rows)
