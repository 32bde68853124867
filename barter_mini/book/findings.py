"""What chapters 02 (training from scratch) and 03 (ablations) showed, composed as Markdown
from the tables the chapters compute, so that a page's conclusion always states its own
numbers (:func:`from_scratch_findings`, :func:`ablation_findings`); and how a chapter hands
its one-sentence answer to the introduction (:func:`glue_headline`; chapter 02's is
:func:`from_scratch_headline`)."""

from __future__ import annotations

import pandas as pd

from ..training.methods import get_method
from .experiments import paired_by_seed, ranking
from .seed_noise import beyond_noise
from .tables import count_noun, listed, signed


def _masked(method: str) -> bool:
    """A masked baseline: full-size tensors at the run's density (dense has a fixed one)."""
    spec = get_method(method)
    return spec.full_width and spec.fixed_density is None


def _points(value: float) -> str:
    return f"{signed(value)} points"


def _sign_words(ours: float, theirs: float) -> str:
    """Whether two differences have the same sign, compared only where both print as
    nonzero points: ``+0.00`` has no sign to agree or disagree with."""
    if round(ours, 2) == 0 or round(theirs, 2) == 0:
        return "no sign to compare at this rounding"
    return "the same sign" if (ours < 0) == (theirs < 0) else "the opposite sign"


def _seed_caveat(seeds: int) -> str:
    if seeds < 2:
        return ("These are single runs (one seed): a gap of a few tenths of a point is within what "
                "another seed would change (the reallocation chapter measures that noise).")
    return (f"Means over {seeds} seeds; a gap smaller than the seed noise it is measured against "
            "says nothing about which is better.")


def _paired_gaps(runs: pd.DataFrame | None, density: float, method: str, reference: str = "barter") -> pd.Series:
    """``reference`` minus ``method`` at ``density``, seed by seed (empty without both)."""
    at = runs[runs["density"] == density] if runs is not None else pd.DataFrame(columns=["method"])
    if not {method, reference} <= set(at["method"]):
        return pd.Series(dtype=float)
    return paired_by_seed(at, "method", method)[reference].dropna()


def _paired_noise(runs: pd.DataFrame | None, density: float, method: str, reference: str = "barter") -> str:
    """``reference`` minus ``method`` at ``density``, paired by seed, against the seed noise:
    '' without two shared seeds."""
    gaps = _paired_gaps(runs, density, method, reference)
    if len(gaps) < 2:
        return ""
    where = "beyond" if beyond_noise(gaps.mean(), gaps.std(), len(gaps)) else "within"
    return f" (paired by seed sd {gaps.std():.2f}: {where} the seed noise)"


def _beyond_at(gaps: dict[float, pd.Series]) -> str:
    """Where the paired gaps ``{density: per-seed gaps}`` are beyond the seed noise, in words."""
    if all(len(gap) < 2 for gap in gaps.values()):
        return "on one seed, which cannot tell a gap from the seed noise"
    beyond = [f"rho {density:g}" for density, gap in gaps.items()
              if len(gap) > 1 and beyond_noise(gap.mean(), gap.std(), len(gap))]
    return f"beyond the seed noise at {listed(beyond)}" if beyond else "within the seed noise at every density"


def from_scratch_headline(summary: pd.DataFrame, runs: pd.DataFrame) -> str:
    """Chapter 02's answer in one sentence for the introduction, from the same table and runs
    as :func:`from_scratch_findings`: BARTER's rank among the sparse methods at each density,
    and its gaps to Static and to the best masked method (test Top-1, the mean gap, and where
    the gap paired by seed is beyond the seed noise)."""
    ours = ranking(summary)
    densities = [d for d in ours.columns if "barter" in ours.index and pd.notna(ours.loc["barter", d])]
    if not densities:
        return "BARTER was not among the methods trained, so there is nothing to compare it with."
    means = summary.set_index(["density", "method"])["acc_mean"]
    ranks = listed([str(int(ours.loc["barter", d])) for d in densities])
    seeds = int(summary["seeds"].min())
    sentence = (f"Trained from scratch at rho = {listed([f'{d:g}' for d in densities])} "
                f"({count_noun(seeds, 'seed')} per point), BARTER ranks {ranks} of the "
                f"{int(ours[densities[0]].notna().sum())} sparse methods")

    def against(other: dict[float, str]) -> str:
        """BARTER minus ``other[density]`` at each density, and where it is beyond the noise."""
        differences = [signed(means[(d, "barter")] - means[(d, other[d])]) for d in densities]
        return f"{listed(differences)} points, {_beyond_at({d: _paired_gaps(runs, d, other[d]) for d in densities})}"

    if "static" in ours.index:
        static = dict.fromkeys(densities, "static")
        sentence += f"; BARTER minus its own frozen allocation (Static) is {against(static)}"
    masked = [m for m in ours.index if _masked(m)]
    if masked:
        best = {d: summary[(summary["density"] == d) & summary["method"].isin(masked)]
                .set_index("method")["acc_mean"].idxmax() for d in densities}
        names = best[densities[0]] if len(set(best.values())) == 1 else listed(best[d] for d in densities)
        sentence += f"; minus the best masked method ({names}), {against(best)}"
    return sentence + "."


def from_scratch_findings(summary: pd.DataFrame, paper: pd.DataFrame, runs: pd.DataFrame | None = None) -> str:
    """Chapter 02's conclusion: at each density, BARTER's rank among the sparse methods trained
    (beside its rank among the same methods in Tables 1 and 13), its gap to Static (what moving
    capacity bought) and to the best masked method (what the compact tensors cost in accuracy).

    ``summary`` is :func:`~barter_mini.book.experiments.summarize`'s table (test Top-1 in %),
    ``paper`` the paper's rows of the same layout; with ``runs`` (the runs it summarizes) the
    gaps are also paired by seed and said to be beyond or within the seed noise
    (:func:`~barter_mini.book.seed_noise.beyond_noise`)."""
    ours = ranking(summary)
    shared = paper[paper["method"].isin(summary["method"]) & paper["density"].isin(summary["density"])]
    theirs = ranking(shared) if not shared.empty else pd.DataFrame()
    lines = []
    for density in ours.columns:
        at = summary[summary["density"] == density].set_index("method")["acc_mean"]
        if "barter" not in at.index:
            continue
        parts = [f"rank {int(ours.loc['barter', density])} of {int(ours[density].notna().sum())} sparse methods"]
        if density in theirs.columns and "barter" in theirs.index and pd.notna(theirs.loc["barter", density]):
            parts[0] += f" (the paper: {int(theirs.loc['barter', density])} among the same methods)"
        if "static" in at.index:
            parts.append(f"{_points(at['barter'] - at['static'])} over Static{_paired_noise(runs, density, 'static')}")
        masked = at[[m for m in at.index if _masked(m)]]
        if not masked.empty:
            parts.append(f"{_points(at['barter'] - masked.max())} over the best masked method "
                         f"({masked.idxmax()}, {masked.max():.2f} %){_paired_noise(runs, density, masked.idxmax())}")
        lines.append(f"- **rho = {density:g}**: BARTER {at['barter']:.2f} % test Top-1, " + "; ".join(parts) + ".")
    if not lines:
        return "BARTER was not among the methods trained, so there is nothing to compare it with."
    seeds = int(summary["seeds"].min())
    lines.append("")
    lines.append(_seed_caveat(seeds) + " The masked methods train full-size tensors whatever their "
                 "density; Static and BARTER train the compact model, whose cost chapter 04 measures.")
    return "\n".join(lines)


def ablation_findings(ours: pd.DataFrame, paper: pd.DataFrame, moved: pd.DataFrame, seeds: int) -> str:
    """Chapter 03's conclusion: each variant's Top-1 minus BARTER's beside the sign the paper's
    Table 12 gives it (Figure 6: every variant below BARTER at rho = 0.5), whether the gap is
    beyond the seed noise (:func:`~barter_mini.book.seed_noise.beyond_noise`, where ``ours``
    has ``acc_diff_sd``), and how many units BARTER and the variants moved.

    ``ours`` and ``paper`` are :func:`~barter_mini.book.experiments.ablation_differences`
    tables, ``moved`` is :func:`~barter_mini.book.experiments.units_moved`'s, ``seeds`` the number
    of seeds behind each mean."""
    paper = paper.set_index("method")
    lines = []
    below = beyond = 0
    paired = "acc_diff_sd" in ours and seeds > 1
    for _, row in ours.iterrows():
        said = noise = ""
        if row["method"] in paper.index:
            theirs = paper.loc[row["method"], "acc_diff"]
            said = f" (the paper: {_points(theirs)}; {_sign_words(row['acc_diff'], theirs)})"
        if paired:
            outside = beyond_noise(row["acc_diff"], row["acc_diff_sd"], int(row["paired_seeds"]))
            beyond += outside
            noise = (f", paired by seed sd {row['acc_diff_sd']:.2f}: "
                     f"{'beyond' if outside else 'within'} the seed noise")
        below += row["acc_diff"] < 0
        lines.append(f"- **{row['method']}**: {_points(row['acc_diff'])} of test Top-1 against BARTER{noise}{said}.")
    lines.append("")
    compared = paper.reindex(ours["method"]).dropna(subset=["acc_diff"])
    theirs_below = int((compared["acc_diff"] < 0).sum())
    lines.append(f"{below} of {len(ours)} variants ended below BARTER here; in the paper {theirs_below} "
                 f"of the {len(compared)} it reports did.")
    if paired:
        lines.append(f"{beyond} of the {len(ours)} gaps {'is' if beyond == 1 else 'are'} beyond twice "
                     f"{'its' if beyond == 1 else 'their'} standard error over {seeds} seeds "
                     "(sd / sqrt(seeds)); the rest cannot be told from the seed noise at this length.")
    if not moved.empty:
        means = moved.groupby("method", sort=False)[["heads moved", "FFN channels moved"]].mean()
        lines.append("Units that ended in another layer than they started in (mean over seeds): "
                     + "; ".join(f"{method} {count_noun(row['heads moved'], 'head')} and "
                                 f"{count_noun(row['FFN channels moved'], 'FFN channel')}"
                                 for method, row in means.iterrows()) + ".")
    lines.append(_seed_caveat(seeds))
    return "\n".join(lines)


def glue_headline(key: str, markdown: str) -> None:
    """Glue a chapter's one-sentence answer (inline Markdown) under ``key`` as HTML, the form
    MyST-NB pastes into another page: the introduction shows it with
    ``{glue:any}`../notebooks/CHAPTER.ipynb::KEY```, so its findings are this build's own and
    never typed."""
    from IPython.display import HTML
    from markdown_it import MarkdownIt
    from myst_nb import glue

    glue(key, HTML(MarkdownIt("commonmark").renderInline(markdown)), display=False)
