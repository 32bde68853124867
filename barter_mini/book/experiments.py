"""Grids of cached training runs and their tables, for the from-scratch and ablation notebooks.

A grid is methods x densities x seeds trained with one notebook profile; every run goes
through :func:`~barter_mini.training.cache.cached_train`, so notebooks share runs and a rebuilt book
retrains nothing. Dense has no density: it is trained once per seed at rho = 1.

Tables follow the paper's convention: Top-1 and macro-F1 in percent, mean and *sample*
standard deviation over seeds (Tables 1, 12, 13: "mean +- std over three seeds"); with a
single seed the std is undefined and left blank.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from tqdm import tqdm

from ..core.budgets import compute_budget, initial_allocation
from ..training.cache import cached_metrics, cached_train
from ..core.models import get_model_config
from ..errors import BarterError, choose
from .profiles import Profile
from ..training.methods import check_methods, get_method
from ..training.run_config import RunConfig

#: the paper's reference tables, transcribed as CSV (comment line first)
PAPER_DIR = Path(__file__).resolve().parents[2] / "data" / "paper"
#: the methods of Table 1, in the paper's order, then the compact ones
FROM_SCRATCH_METHODS = ("dense", "set", "snfs", "rigl", "srigl", "s2vite", "static", "barter")
#: Figure 6 / Table 12: BARTER's ablations, each compared with BARTER itself
ABLATION_METHODS = ("static", "random-receiver", "random-donor", "random-pair", "barter")


def profile_run(setup: Profile, method: str, density: float, seed: int) -> RunConfig:
    """The training run of ``method`` at ``density`` and ``seed`` under a notebook profile."""
    return RunConfig(method=method, model=setup.model, dataset=setup.dataset, density=density,
                     seed=seed, recipe=setup.recipe, epochs=setup.epochs,
                     train_subset=setup.grid_train_subset, precision=setup.precision, progress=False)


def _densities_of(method: str, densities) -> list[float]:
    """The densities a grid trains ``method`` at: its fixed one (dense: 1) or every one asked."""
    fixed = get_method(method).fixed_density
    return [fixed] if fixed is not None else list(densities)


def grid_runs(setup: Profile, methods, densities, seeds) -> list[RunConfig]:
    """The runs of :func:`run_grid`, in its order (what ``barter-mini sweep`` trains for it)."""
    methods = check_methods(methods)
    return [profile_run(setup, m, d, s) for m in methods for d in _densities_of(m, densities) for s in seeds]


def run_grid(setup: Profile, methods, densities, seeds, progress: bool = True) -> pd.DataFrame:
    """Train (or read from the cache) every run of the grid; one row per run.

    Columns: method, density, seed, val/test Top-1 and macro-F1 (%), wall time, exported-size
    parameters of the trained model, the final per-layer heads and FFN channels.
    """
    rows = []
    for run in tqdm(grid_runs(setup, methods, densities, seeds), desc="runs", disable=not progress):
        method, density, seed = run.method, run.density, run.seed
        metrics = cached_train(run)
        rows.append({"method": method, "density": density, "seed": seed, **run_scores(metrics),
                     "wall_time_s": metrics["wall_time_s"], "params": metrics["params"],
                     "heads": tuple(metrics["allocation"]["heads"]),
                     "ffn": tuple(metrics["allocation"]["ffn"])})
    return pd.DataFrame(rows)


def run_scores(metrics: dict) -> dict:
    """A run's validation and test Top-1 and macro-F1 in %, under the names of the book's
    tables (``val_acc``, ``val_f1``, ``acc``, ``f1``), from its metrics.json."""
    return {"val_acc": 100 * metrics["val_acc"], "val_f1": 100 * metrics["val_macro_f1"],
            "acc": 100 * metrics["test_acc"], "f1": 100 * metrics["test_macro_f1"]}


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std over seeds of test Top-1 and macro-F1 (%), per method and density."""
    grouped = runs.groupby(["method", "density"], sort=False)
    table = grouped.agg(acc_mean=("acc", "mean"), acc_std=("acc", "std"),
                        f1_mean=("f1", "mean"), f1_std=("f1", "std"), seeds=("seed", "count"),
                        wall_time_s=("wall_time_s", "mean"))
    return table.reset_index()


def read_paper_table(name: str) -> pd.DataFrame:
    """One of ``data/paper/*.csv`` (e.g. ``table01_from_scratch_cct_cifar100``)."""
    path = PAPER_DIR / f"{name}.csv"
    if not path.is_file():
        known = sorted(p.stem for p in PAPER_DIR.glob("*.csv"))
        raise BarterError(f"no paper table {name!r}: known tables are {', '.join(known)}")
    return pd.read_csv(path, comment="#")


def paper_from_scratch() -> pd.DataFrame:
    """Tables 1 (dense, SET, SNFS, RigL) and 13 (static, BARTER), CCT on CIFAR-100."""
    return pd.concat([read_paper_table("table01_from_scratch_cct_cifar100"),
                      read_paper_table("table13_static_vs_barter_cct_cifar100")], ignore_index=True)


def mean_std(mean, std) -> str:
    """``72.85 +- 0.16`` (the std left out where it is undefined)."""
    if pd.isna(mean):
        return ""
    return f"{mean:.2f}" if pd.isna(std) else f"{mean:.2f} ± {std:.2f}"


def beside_paper(summary: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Our mean +- std beside the paper's, one row per method and density (Table 1 layout).

    The paper's rows come from CCT on CIFAR-100; ours from the profile's model and dataset,
    so only orderings, not values, are comparable on the quick profile. A blank paper cell
    means our copy of the paper has no number there.
    """
    merged = summary.merge(paper, on=["method", "density"], how="left", suffixes=("", "_paper"))
    return pd.DataFrame({
        "method": merged["method"], "density": merged["density"], "seeds": merged["seeds"],
        "Top-1 (%)": [mean_std(m, s) for m, s in zip(merged["acc_mean"], merged["acc_std"])],
        "macro-F1 (%)": [mean_std(m, s) for m, s in zip(merged["f1_mean"], merged["f1_std"])],
        "paper Top-1 (%)": [mean_std(m, s) for m, s in zip(merged["acc_mean_paper"], merged["acc_std_paper"])],
        "paper macro-F1 (%)": [mean_std(m, s) for m, s in zip(merged["f1_mean_paper"], merged["f1_std_paper"])],
    })


def ranking(summary: pd.DataFrame, column: str = "acc_mean") -> pd.DataFrame:
    """Methods ranked by ``column`` at each density (1 = best); dense excluded."""
    sparse = summary[summary["method"] != "dense"].copy()
    sparse["rank"] = sparse.groupby("density")[column].rank(ascending=False, method="min").astype(int)
    return sparse.pivot(index="method", columns="density", values="rank")


def gaps_to(summary: pd.DataFrame, reference: str = "barter") -> pd.DataFrame:
    """Per method and density: ``reference``'s mean Top-1 minus the method's, in points
    (positive: the reference is better; dense, trained once at rho = 1, is compared at every
    density), and the method's mean wall time in seconds."""
    rows = []
    dense = summary[summary["method"] == "dense"]
    for _, own in summary[summary["method"] == reference].iterrows():
        at_density = summary[summary["density"] == own["density"]]
        for _, other in pd.concat([dense, at_density[at_density["method"] != reference]]).iterrows():
            rows.append({"density": own["density"], "method": other["method"],
                         f"{reference} minus method (Top-1 points)": own["acc_mean"] - other["acc_mean"],
                         f"{reference} minus method (macro-F1 points)": own["f1_mean"] - other["f1_mean"],
                         "method wall time (s)": other["wall_time_s"],
                         f"{reference} wall time (s)": own["wall_time_s"]})
    return pd.DataFrame(rows)


def rankings_beside_paper(summary: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Our rank of each sparse method at each density beside the paper's rank among the same
    methods (blank where the paper reports no number), sorted by our rank at the first density."""
    ours = ranking(summary)
    shared = paper[paper["method"].isin(summary["method"]) & paper["density"].isin(summary["density"])]
    theirs = ranking(shared).reindex(ours.index) if not shared.empty else pd.DataFrame(index=ours.index)
    columns = {}
    for density in ours.columns:
        columns[f"rank at rho={density:g}"] = ours[density]
        columns[f"paper rank at rho={density:g}"] = theirs[density] if density in theirs.columns else pd.NA
    table = pd.DataFrame(columns, index=ours.index).sort_values(f"rank at rho={ours.columns[0]:g}")
    return table.astype("Int64")


def paired_by_seed(runs: pd.DataFrame, by: str, reference, value: str = "acc") -> pd.DataFrame:
    """``value`` of every ``by`` (columns) minus ``reference``'s on the same seed (rows): the
    differences the book tells from the seed noise (NaN where either lacks that seed)."""
    by_seed = runs.pivot_table(index="seed", columns=by, values=value, aggfunc="mean")
    return by_seed.sub(by_seed[reference], axis=0)


def ablation_differences(runs: pd.DataFrame, reference: str = "barter") -> pd.DataFrame:
    """Figure 6: each variant's mean Top-1 and macro-F1 minus ``reference``'s, in points.

    Means over seeds are taken first, as in the paper's figure ("values are means over three
    seeds per method"); the variant's own scores are kept beside the differences. With two
    seeds or more shared with the reference, ``acc_diff_sd`` is the sample standard deviation
    over seeds of the Top-1 gap paired by seed (variant minus reference on the same seed) and
    ``paired_seeds`` their number: what tells a gap from the seed noise.
    """
    means = runs.groupby("method", sort=False)[["acc", "f1"]].mean()
    if reference not in means.index:
        raise BarterError(f"the ablation table needs the reference method {reference!r} among the runs")
    variants = [m for m in means.index if m != reference]
    if "seed" in runs:
        paired = paired_by_seed(runs, "method", reference)
        gaps = {m: paired[m].dropna() for m in variants}
    else:                                   # means only (the paper's table)
        gaps = {m: pd.Series(dtype=float) for m in variants}
    return pd.DataFrame({
        "method": variants,
        "acc": [means.loc[m, "acc"] for m in variants],
        "acc_diff": [means.loc[m, "acc"] - means.loc[reference, "acc"] for m in variants],
        "f1": [means.loc[m, "f1"] for m in variants],
        "f1_diff": [means.loc[m, "f1"] - means.loc[reference, "f1"] for m in variants],
        "acc_diff_sd": [gaps[m].std() if len(gaps[m]) > 1 else float("nan") for m in variants],
        "paired_seeds": [len(gaps[m]) for m in variants],
    })


def paper_ablation_differences() -> pd.DataFrame:
    """Figure 6 from the paper's Table 12 means (CCT on CIFAR-100, rho = 0.5)."""
    paper = read_paper_table("table12_ablations_cct_cifar100")
    means = ablation_differences(paper.rename(columns={"acc_mean": "acc", "f1_mean": "f1"}))
    return means.drop(columns=["acc_diff_sd", "paired_seeds"])        # the table gives means only


def units_moved(runs: pd.DataFrame, model: str) -> pd.DataFrame:
    """Per run: heads and FFN channels that end in another layer than the initial even spread,
    ``sum_l |n_l - n_l^0| / 2`` (the budgets are fixed, so every unit moved leaves one layer
    and joins another). Compact methods only: full-width runs are left out."""
    config = get_model_config(model)
    rows = []
    for _, run in runs.iterrows():
        if get_method(run["method"]).full_width:
            continue
        start = initial_allocation(config, compute_budget(config, run["density"]))
        rows.append({"method": run["method"], "seed": run["seed"],
                     "heads moved": sum(abs(a - b) for a, b in zip(run["heads"], start.heads)) // 2,
                     "FFN channels moved": sum(abs(a - b) for a, b in zip(run["ffn"], start.ffn)) // 2})
    return pd.DataFrame(rows)


def final_allocations(runs: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Units of ``kind`` ("heads" or "ffn") per layer at the end of training, one row per run."""
    choose("kind", kind, ("heads", "ffn"))
    frame = pd.DataFrame(runs[kind].tolist(), index=[f"{m} (seed {s})" for m, s in zip(runs["method"], runs["seed"])])
    frame.columns = pd.Index(range(frame.shape[1]), name="layer")
    return frame


def accuracy_beside_step_time(setup: Profile, bench_rows: list[dict], seeds,
                              recorded: pd.DataFrame | None = None) -> pd.DataFrame:
    """Figure 1's points: each benchmarked method and density with a mean test Top-1 (%):
    of the ``recorded`` runs (a recorded grid's table, such as chapter 02's) where they have
    the method at that density (dense: at its one density), else of the profile's from-scratch
    runs of ``seeds`` when the cache holds them, else blank (nothing is trained here).
    ``runs`` counts the runs averaged, ``source`` says whose they are."""
    points = []
    for row in bench_rows:
        accs, source = [], "recorded"
        if recorded is not None:
            fixed = get_method(row["method"]).fixed_density is not None
            mine = recorded[(recorded["method"] == row["method"])
                            & (fixed | ((recorded["density"] - row["density"]).abs() < 1e-9))]
            accs = list(mine["acc"])
        if not accs:
            found = [cached_metrics(profile_run(setup, row["method"], row["density"], seed)) for seed in seeds]
            accs, source = [100 * metrics["test_acc"] for metrics in found if metrics is not None], "this build"
        points.append({"method": row["method"], "density": row["density"], "step_ms": row["step_ms"],
                       "acc": sum(accs) / len(accs) if accs else float("nan"), "runs": len(accs),
                       "source": source if accs else ""})
    return pd.DataFrame(points)
