"""The paper's numbers that the book's Markdown pages quote, read from ``data/paper/`` (the
same files the notebooks compare against), as MyST substitutions: a page writes
``{{ iphone_speedup }}`` and the build fills it in, so no number is typed in two places.

:func:`paper_substitutions` is what the book build writes into the staged ``_config.yml``
(``parse.myst_substitutions``).
"""

from __future__ import annotations

from .experiments import paper_from_scratch, read_paper_table


def _accuracy(table, method: str, density: float) -> float:
    return float(table[(table["method"] == method) & (table["density"] == density)]["acc_mean"].iloc[0])


def accuracy_table(paper) -> str:
    """The introduction's table: Static and BARTER (Table 13) beside RigL (Table 1), CCT on
    CIFAR-100, Top-1 (%) per density, as Markdown (``paper``:
    :func:`~barter_mini.book.experiments.paper_from_scratch`)."""
    lines = ["| density | static compact model | BARTER | RigL |", "|---:|---:|---:|---:|"]
    for density in sorted(paper[paper["method"] == "barter"]["density"]):
        lines.append(f"| {density:g} | " + " | ".join(f"{_accuracy(paper, method, density):.2f}"
                                                     for method in ("static", "barter", "rigl")) + " |")
    return "\n".join(lines)


def paper_substitutions() -> dict[str, str]:
    """Every paper number the Markdown pages quote, by substitution key."""
    paper = paper_from_scratch()
    iphone = read_paper_table("table02_iphone_cct").set_index("method")["s_per_epoch"]
    epochs = read_paper_table("table06_08_epoch_time_gpu")
    cct = epochs[epochs["model"] == "cct-paper"]
    masked = cct[cct["method"] != "dense"]["s_per_epoch_mean"]     # SET, SNFS, RigL and SRigL
    return {
        "paper_accuracy_table": accuracy_table(paper),
        "paper_dense_acc": f"{_accuracy(paper, 'dense', 1.0):.2f}",
        "iphone_dense_s": f"{iphone['dense']:,.2f}",
        "iphone_rigl_s": f"{iphone['rigl']:,.2f}",
        "iphone_barter_s": f"{iphone['barter']:,.2f}",
        "iphone_speedup": f"{iphone['rigl'] / iphone['barter']:.2f}",
        "table6_dense_s": f"{float(cct[cct['method'] == 'dense']['s_per_epoch_mean'].iloc[0]):.2f}",
        "table6_masked_low_s": f"{masked.min():.2f}",
        "table6_masked_high_s": f"{masked.max():.2f}",
    }
