"""The efficiency notebook's measurement sizes, its compute table beside the paper's and its
Table 2 comparison (pandas side of ``barter-mini bench``, whose rows it reads)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..errors import BarterError
from .experiments import read_paper_table
from .report import by_density
from .tables import settings_markdown


@dataclass(frozen=True)
class BenchProfile:
    """How much the efficiency notebook measures under a notebook profile.

    ``paper_models`` (model, batch) are benchmarked for the paper's efficiency tables; the
    profile's own training model is benchmarked at its recipe's batch for Figure 1.
    ``profile_steps`` steps of every case run under the profiler (where the time goes);
    ``executions`` are measured side by side for RigL and BARTER on every paper model at the
    lowest of the notebook's densities (all of them where ``all_densities_executed``).
    """

    paper_models: tuple[tuple[str, int], ...]
    steps: int
    warmup: int
    segment_steps: int
    update_samples: int
    profile_steps: int = 2
    executions: tuple[str, ...] = ("eager", "compiled", "recompute")
    all_densities_executed: bool = False

    def _repr_markdown_(self) -> str:
        return settings_markdown(self, "What this chapter measures")


BENCH_PROFILES = {
    # the smoke profile skips the compiled execution: a first compile takes half a minute per case here
    "smoke": BenchProfile((("cct-mini", 16),), steps=2, warmup=1, segment_steps=1, update_samples=1,
                          profile_steps=1, executions=("eager", "recompute")),
    # the quick book's budget is an hour on two cores: batch 16, one sample of each extra
    # measurement, and no compiled execution (a first compile takes half a minute per case)
    "quick": BenchProfile((("cct-paper", 16), ("vit-paper", 16)), steps=3, warmup=1, segment_steps=1,
                          update_samples=1, profile_steps=1, executions=("eager", "recompute")),
    "long": BenchProfile((("cct-paper", 32), ("vit-paper", 32)), steps=5, warmup=2, segment_steps=3,
                         update_samples=3, profile_steps=3, all_densities_executed=True),
    "paper": BenchProfile((("cct-paper", 128), ("vit-paper", 256)), steps=20, warmup=5, segment_steps=50,
                          update_samples=5, profile_steps=5, all_densities_executed=True),
}


#: per model, the paper's table of training GFLOPs per image and exported parameters (M) in
#: ``data/paper`` and its name. Only the model a table reports is compared with it: Table 15
#: is CCT on CIFAR-100. ViT's compute table (Table 9, ViT on Tiny-ImageNet) is not among our
#: transcriptions, so ViT's paper cells stay blank, as do those of models the paper does not
#: train (cct-mini).
PAPER_COMPUTE_TABLES = {"cct-paper": ("table15_compute_and_size_cct", "Table 15")}


#: the bench's columns the chapter's cost tables show, by the words a table heads them with
COST_MEASURES = {"ms/step": "step_ms", "s/epoch": "epoch_s", "peak memory (MB)": "peak_mem_mb"}


def cost_by_density(rows_by_model: dict[str, list[dict]], decimals: int = 1) -> dict[str, pd.DataFrame]:
    """Per measure of :data:`COST_MEASURES`, one table: a row per model and method, a column
    per density (Tables 6, 8 and 14 in layout), so that a page of four densities stays six
    columns wide however many models were measured."""
    return {what: pd.concat({model: by_density(rows, value).round(decimals) for model, rows in rows_by_model.items()},
                            names=["model"])
            for what, value in COST_MEASURES.items()}


def compute_beside_paper(rows, methods=("static", "barter")) -> pd.DataFrame:
    """Our compute and size rows of ``methods`` beside the paper's numbers for the same model.

    ``rows`` are :func:`~barter_mini.measure.bench.compute_and_size_rows` (or bench) rows
    of any models. Added columns: ``params_m`` (exported parameters, millions), and
    ``paper_train_gflops_per_image``, ``paper_params_m`` and ``paper_table`` from the
    paper's table for that row's model (:data:`PAPER_COMPUTE_TABLES`), matched on model,
    method and density: blank where the paper reports no number for that model.
    """
    frame = pd.DataFrame(rows)
    frame = frame[frame["method"].isin(list(methods))].reset_index(drop=True)
    frame["params_m"] = frame["params"] / 1e6
    paper = pd.concat(
        [read_paper_table(name)[["method", "density", "train_gflops_per_image", "params_m"]]
         .assign(model=model, paper_table=label) for model, (name, label) in PAPER_COMPUTE_TABLES.items()],
        ignore_index=True).rename(columns={"train_gflops_per_image": "paper_train_gflops_per_image",
                                           "params_m": "paper_params_m"})
    merged = frame.merge(paper, on=["model", "method", "density"], how="left", validate="many_to_one")
    return merged


def iphone_comparison(rows: list[dict], density: float = 0.3) -> pd.DataFrame:
    """Table 2 in spirit: dense, RigL and BARTER at ``density`` on this machine (ms/step,
    s/epoch and speedup over RigL) beside the paper's iPhone 13 Pro Max figures.

    The speedup is RigL's seconds per epoch over the method's, the ratio the paper's abstract
    quotes (2.78x for BARTER on the iPhone; its ms/step columns give a slightly smaller one)."""
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
                    "s/epoch (here)": ours["epoch_s"], "speedup over RigL (here)": rigl["epoch_s"] / ours["epoch_s"],
                    "ms/step (iPhone)": paper.loc[method, "ms_per_step"],
                    "s/epoch (iPhone)": paper.loc[method, "s_per_epoch"],
                    "speedup over RigL (iPhone)": paper.loc["rigl", "s_per_epoch"] / paper.loc[method, "s_per_epoch"]})
    return pd.DataFrame(out)


def _eager_by_model(comparison: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The eager rows of ``comparison`` per model, in order of density."""
    eager = comparison[comparison["execution"] == "eager"]
    return [(model, rows.sort_values("density")) for model, rows in eager.groupby("model", sort=False)]


def what_this_showed(comparison: pd.DataFrame, device: str) -> str:
    """Chapter 04's conclusion as Markdown from its own eager measurements: per model, BARTER's
    speedup over RigL per step beside the FLOPs-ideal one, its peak memory as a share of RigL's
    and its topology updates' share of training, at the lowest and the highest density measured.

    ``comparison`` holds :func:`~barter_mini.measure.bench_report.ratios` rows with a ``model``
    column."""
    by_model = _eager_by_model(comparison)
    if not by_model:
        return "No eager BARTER and RigL pair was measured, so there is nothing to compare."
    lines = []
    for model, rows in by_model:
        cases = [rows.iloc[0]] if len(rows) == 1 else [rows.iloc[0], rows.iloc[-1]]
        said = "; ".join(
            f"at rho = {r['density']:g} {r['speedup']:.2f}x faster per step than RigL (FLOPs ideal "
            f"{r['ideal_speedup']:.2f}x, so {100 * r['efficiency']:.0f} % of it) with "
            f"{100 * r['memory_fraction']:.0f} % of RigL's peak memory" for r in cases)
        updates = rows["update_percent_of_training"].max()
        share = f"at most {updates:.2f} %" if updates >= 0.005 else "less than 0.01 %"
        lines.append(f"- **{model}** on {device}: {said}. Its topology updates took {share} of training time.")
    lines.append("")
    lines.append("The FLOPs-ideal speedup is what the compact model could give if time followed FLOPs; "
                 "the gap to it is the fixed, width-independent work that section 2's profile shows.")
    return "\n".join(lines)


def _span(low: float, high: float, fmt: str) -> str:
    """``low`` to ``high`` in ``fmt``, or the one value where they print the same."""
    low_text, high_text = format(low, fmt), format(high, fmt)
    return low_text if low_text == high_text else f"{low_text} to {high_text}"


def headline(comparison: pd.DataFrame, device: str) -> str:
    """Chapter 04's answer in one sentence for the introduction, from the same eager rows as
    :func:`what_this_showed`: per model, BARTER's speed as a multiple of RigL's at the lowest
    and highest density, as a share of the FLOPs-ideal speedup, and its peak memory as a
    share of RigL's."""
    by_model = _eager_by_model(comparison)
    if not by_model:
        return "No eager BARTER and RigL pair was measured in this build."
    parts = []
    for model, rows in by_model:
        low, high = rows.iloc[0], rows.iloc[-1]
        speeds = (f"{low['speedup']:.2f}x RigL's speed at rho = {low['density']:g}" if len(rows) == 1 else
                  f"{low['speedup']:.2f}x RigL's speed at rho = {low['density']:g} and {high['speedup']:.2f}x "
                  f"at {high['density']:g}")
        efficiency = _span(100 * rows["efficiency"].min(), 100 * rows["efficiency"].max(), ".0f")
        memory = _span(100 * rows["memory_fraction"].min(), 100 * rows["memory_fraction"].max(), ".0f")
        parts.append(f"on `{model}` BARTER's step ran at {speeds} ({efficiency} % of its FLOPs-ideal "
                     f"speedup) and held {memory} % of RigL's peak memory")
    return f"Measured on this machine ({device}): " + "; ".join(parts) + "."
