"""The efficiency notebook's measurement sizes and its Table 2 comparison (pandas side of
``barter-mini bench``, whose rows it reads)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..errors import BarterError
from .experiments import read_paper_table


@dataclass(frozen=True)
class BenchProfile:
    """How much the efficiency notebook measures under a notebook profile.

    ``paper_models`` (model, batch) are benchmarked for the paper's efficiency tables; the
    profile's own training model is benchmarked at its recipe's batch for Figure 1.
    """

    paper_models: tuple[tuple[str, int], ...]
    steps: int
    warmup: int
    segment_steps: int
    update_samples: int


BENCH_PROFILES = {
    "smoke": BenchProfile((("cct-mini", 16),), steps=2, warmup=1, segment_steps=1, update_samples=1),
    "quick": BenchProfile((("cct-paper", 32),), steps=3, warmup=1, segment_steps=2, update_samples=2),
    "paper": BenchProfile((("cct-paper", 128), ("vit-paper", 256)), steps=20, warmup=5, segment_steps=50,
                          update_samples=5),
}


def iphone_comparison(rows: list[dict], density: float = 0.3) -> pd.DataFrame:
    """Table 2 in spirit: dense, RigL and BARTER at ``density`` on this machine (ms/step,
    s/epoch and speedup over RigL) beside the paper's iPhone 13 Pro Max figures."""
    paper = read_paper_table("table02_iphone_cct").set_index("method")
    by_case = {(r["method"], r["density"]): r for r in rows}
    cases = [("dense", 1.0), ("rigl", density), ("barter", density)]
    if any(case not in by_case for case in cases):
        raise BarterError(f"the Table 2 comparison needs dense, rigl and barter at density {density:g} in the bench")
    rigl = by_case["rigl", density]
    out = []
    for method, rho in cases:
        ours = by_case[method, rho]
        out.append({"method": method, "density": rho, "ms/step (here)": ours["step_ms"],
                    "s/epoch (here)": ours["epoch_s"], "speedup over RigL (here)": rigl["step_ms"] / ours["step_ms"],
                    "ms/step (iPhone)": paper.loc[method, "ms_per_step"],
                    "s/epoch (iPhone)": paper.loc[method, "s_per_epoch"],
                    "speedup over RigL (iPhone)": paper.loc["rigl", "ms_per_step"] / paper.loc[method, "ms_per_step"]})
    return pd.DataFrame(out)
