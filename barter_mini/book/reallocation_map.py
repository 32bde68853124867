"""The map of where reallocation pays: BARTER against Static, paired by seed, along the axes
that separate the book's setting from the paper's (chapter 05; paper Table 13).

The map's runs take hours on two cores, more than a book build may spend, so they are
trained once by ``barter-mini sweep`` and recorded, one row per run, in :data:`MAP_CSV`
with the exact command and the commit of the code that trained it (:func:`rows_from_cache`).
The book reads that file (:func:`paired_cells`) and marks what it draws as recorded, not
recomputed.

A cell is one setting (model, density, epochs, training images, start); its value is the
paired difference ``d_s = acc(BARTER, s) - acc(Static, s)`` over the seeds ``s`` both
methods ran, reported as ``mean(d)``, ``std(d)`` (n - 1) and the standard error
``std(d) / sqrt(n)``, on validation (which decides) and on test (beside it).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ..core.models import get_model_config
from ..errors import BarterError, check_list
from ..training.cache import cached_train
from ..training.checkpoints import read_json, write_csv_atomically
from ..training.run_config import RunConfig
from .seed_noise import RULE, STANDARD_ERRORS, paired_summary, standing
from .tables import listed, signed

#: the recorded runs of the map (one row per run)
MAP_CSV = Path(__file__).resolve().parents[2] / "data" / "reallocation_map.csv"
#: what identifies a cell of the map
CELL = ("model", "dataset", "density", "epochs", "train_subset", "start")
#: the columns of :data:`MAP_CSV`
COLUMNS = CELL + ("method", "seed", "val_acc", "test_acc", "train_time_s", "threads", "commit", "command")
#: the two methods a cell compares: the first minus the second
PAIR = ("barter", "static")


def sweep_command(run: dict) -> str:
    """The ``barter-mini sweep`` command that trains the pair of runs (BARTER and Static) of
    one seed of a cell, as the map's runs were trained (one one-thread job)."""
    command = ["barter-mini", "sweep", "--methods", ",".join(reversed(PAIR)), "--densities", f"{run['density']:g}",
               "--seeds", str(run["seed"]), "--model", run["model"], "--dataset", run["dataset"],
               "--recipe", run["recipe"], "--epochs", str(run["epochs"])]
    if run.get("train_subset") is not None:
        command += ["--train-subset", str(run["train_subset"])]
    if run.get("start", "even") != "even":
        command += ["--start", run["start"]]
    return " ".join(command + ["--jobs", "1", "--threads-per-job", "1"])


def rows_from_cache(cache_dir: Path, commit: str) -> list[dict]:
    """One row per finished BARTER or Static run in the run cache ``cache_dir`` (its
    metrics.json), trained by the code at ``commit``."""
    rows = []
    for path in sorted(Path(cache_dir).glob("*/metrics.json")):
        metrics = read_json(path)
        run = metrics["run"]
        if run["method"] not in PAIR:
            continue
        rows.append(map_row(run, metrics, commit))
    return rows


def map_row(run: dict, metrics: dict, commit: str) -> dict:
    """One run as a row of the map (:data:`COLUMNS`): ``run`` its settings, ``metrics`` its
    metrics.json, ``commit`` the code that trained it (empty for a reader's own run)."""
    return {"model": run["model"], "dataset": run["dataset"], "density": run["density"],
            "epochs": metrics["epochs"], "train_subset": run.get("train_subset") or "",
            "start": run.get("start", "even"), "method": run["method"], "seed": run["seed"],
            "val_acc": metrics["val_acc"], "test_acc": metrics["test_acc"],
            "train_time_s": round(metrics["train_time_s"], 1), "threads": metrics["threads"],
            "commit": commit, "command": sweep_command({**run, "epochs": metrics["epochs"]})}


def write_map(rows: list[dict], path: Path = MAP_CSV) -> Path:
    """``rows`` merged into the CSV at ``path`` (a row of the same cell, method and seed is
    replaced), sorted, written atomically."""
    known = {}
    if Path(path).is_file():
        for row in read_map(path).to_dict("records"):
            known[_row_key(row)] = row
    for row in rows:
        known[_row_key(row)] = row
    ordered = sorted(known.values(), key=lambda row: tuple(str(row[key]) for key in CELL + ("method",)) + (int(row["seed"]),))
    return write_csv_atomically(Path(path), COLUMNS, ordered)


def _row_key(row: dict) -> tuple:
    return tuple(str(row[key]) for key in CELL + ("method",)) + (int(row["seed"]),)


def read_map(path: Path = MAP_CSV) -> pd.DataFrame:
    """The recorded runs (``train_subset`` empty: all training images)."""
    frame = pd.read_csv(path, dtype={"train_subset": "string", "commit": "string"}, keep_default_na=False)
    return frame


def paired_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the seeds both methods ran (``seeds``), the paired difference BARTER - Static
    in Top-1 points on validation and test (mean, std, standard error), and what a run cost
    (median seconds of training, one thread)."""
    twice = frame[frame.duplicated(list(CELL) + ["method", "seed"])]
    if len(twice):
        row = twice.iloc[0]
        raise ValueError(f"{row.method} ran seed {row.seed} twice in the cell "
                         f"{cell_label(dict(row))}: keep one run per method and seed")
    cells = []
    for cell, runs in frame.groupby(list(CELL), sort=True):
        by_method = {method: runs[runs.method == method].set_index("seed") for method in PAIR}
        seeds = sorted(set(by_method[PAIR[0]].index) & set(by_method[PAIR[1]].index))
        if not seeds:
            continue
        entry = dict(zip(CELL, cell), seeds=len(seeds), run_s=float(np.median(runs.train_time_s)))
        for split in ("val", "test"):
            gaps = 100 * (by_method[PAIR[0]].loc[seeds, f"{split}_acc"].to_numpy()
                          - by_method[PAIR[1]].loc[seeds, f"{split}_acc"].to_numpy())
            mean, std, sem = paired_summary(gaps)
            entry.update({f"{split}_gap": mean, f"{split}_std": std, f"{split}_sem": sem})
        cells.append(entry)
    return pd.DataFrame(cells)


# ----------------------------------------------------------------------------- the book's map

#: the settings a cell varies, in the words of the map's reading
AXES = {"depth": "the depth", "heads": "the heads per layer",
        "density": "the density", "epochs": "the training length", "start": "the start"}
#: the models of the map, one change apart: (from, to) -> the axis it changes
MODEL_STEPS = {("cct-mini", "cct-mini-deep"): "depth", ("cct-mini-deep", "cct-mini-deep-16h"): "heads"}
#: the numeric settings' axes, by the cell's column they change
VALUE_AXES = {"density": "density", "epochs": "epochs"}
START_WORDS = {"even": "even", "first": "piled", "last": "piled-last"}


def _shape(name: str) -> str:
    config = get_model_config(name)
    return f"{config.depth}x{config.heads_per_layer}"


def cell_label(cell, leave_out: str = "") -> str:
    """``cct-mini-deep 7x10, rho 0.1, 3 ep, piled start`` (layers x heads per layer); the
    setting named ``leave_out`` (a CELL column) is left out."""
    parts = []
    if leave_out != "model":
        parts.append(f"{cell['model']} {_shape(cell['model'])}")
    if leave_out != "density":
        parts.append(f"rho {float(cell['density']):g}")
    if leave_out != "epochs":
        parts.append(f"{int(cell['epochs'])} ep")
    if leave_out != "start" and cell["start"] != "even":
        parts.append(f"{START_WORDS.get(cell['start'], cell['start'])} start")
    return ", ".join(parts)


def map_table(cells: pd.DataFrame) -> pd.DataFrame:
    """The cells as the chapter shows them: one row each, gaps in Top-1 points (mean ±
    the standard error of the paired difference), ``standing`` by the book's rule
    (:func:`~barter_mini.book.seed_noise.standing`), cost in minutes of one thread per run."""
    rows = []
    for cell in cells.to_dict("records"):
        rows.append({"cell (model layers x heads)": cell_label(cell), "seeds": int(cell["seeds"]),
                     "BARTER − Static, validation": f"{signed(cell['val_gap'])} ± {cell['val_sem']:.2f}",
                     "standing": standing(cell["val_gap"], cell["val_sem"]),
                     "test": f"{signed(cell['test_gap'])} ± {cell['test_sem']:.2f}",
                     "min per run": round(cell["run_s"] / 60, 1)})
    return pd.DataFrame(rows)


def paper_gaps(table: pd.DataFrame) -> pd.DataFrame:
    """Table 13's BARTER - Static per density (test means of three seeds, not paired)."""
    means = table.pivot_table(index="density", columns="method", values="acc_mean")
    return pd.DataFrame({"density": means.index, "gap": (means["barter"] - means["static"]).to_numpy()})


def plot_map(cells: pd.DataFrame, paper: pd.DataFrame, added: pd.DataFrame | None = None):
    """One row per cell: the paired gap BARTER - Static on validation (mean, bars of twice the
    standard error: a bar that crosses zero is within the seed noise), test beside it, and below them the paper's Table 13 gaps (cct-paper on CIFAR-100,
    200 epochs, unpaired test means). ``added``: cells the reader trained now, marked so."""
    palette = sns.color_palette("colorblind")
    rows, labels = [], []
    for origin, frame in (("", cells), (" (yours)", added if added is not None else cells.iloc[:0])):
        for cell in frame.to_dict("records"):
            rows.append(cell)
            labels.append(cell_label(cell) + origin)
    paper_labels = [f"paper: cct-paper 7x16, rho {d:g}, 200 ep" for d in paper["density"]]
    fig, ax = plt.subplots(figsize=(7, 0.3 * (len(rows) + len(paper_labels)) + 1.6), constrained_layout=True)
    y = np.arange(len(rows))[::-1] + len(paper_labels) + 1.0
    ax.errorbar([r["val_gap"] for r in rows], y + 0.12, xerr=[STANDARD_ERRORS * r["val_sem"] for r in rows], fmt="o",
                color=palette[0], capsize=3, label="validation, paired (± 2 SE)")
    ax.plot([r["test_gap"] for r in rows], y - 0.12, "s", mfc="none", color=palette[1], label="test")
    paper_y = np.arange(len(paper_labels))[::-1].astype(float)
    ax.plot(paper["gap"], paper_y, "D", color=palette[2], label="paper, Table 13 (CIFAR-100)")
    ax.axvline(0, color="0.3", lw=1)
    ax.axhline(len(paper_labels) - 0.0, color="0.8", lw=1)
    ax.set_yticks(list(y) + list(paper_y), labels + paper_labels, fontsize=9)
    ax.set_ylim(-0.7, y.max() + 0.7 if len(y) else len(paper_labels) + 0.7)
    ax.set_xlabel("BARTER − Static (Top-1 points)")
    handles, names = ax.get_legend_handles_labels()
    order = [names.index(name) for name in ("validation, paired (± 2 SE)", "test", "paper, Table 13 (CIFAR-100)")]
    fig.legend([handles[i] for i in order], [names[i] for i in order], fontsize=9, loc="outside upper center",
               ncols=3, frameon=False, handletextpad=0.3, columnspacing=1.0)
    ax.grid(axis="x", alpha=0.3)
    return fig


def _axis_of(a: dict, b: dict) -> str | None:
    """The axis along which cell ``a`` -> ``b`` changes exactly one setting toward the
    paper's (deeper, more heads, longer, piled; densities in increasing order), else None."""
    differ = [key for key in ("model", "density", "epochs", "start") if str(a[key]) != str(b[key])]
    if len(differ) != 1:
        return None
    key = differ[0]
    if key == "model":
        return MODEL_STEPS.get((a["model"], b["model"]))
    if key == "start":
        return "start" if a["start"] == "even" else None
    return VALUE_AXES[key] if float(a[key]) < float(b[key]) else None


def _gap_words(cell: dict) -> str:
    return f"{signed(cell['val_gap'])} ± {cell['val_sem']:.2f} ({standing(cell['val_gap'], cell['val_sem'])})"


def _change_words(axis: str, a: dict, b: dict) -> str:
    column = {"depth": "model", "heads": "model"}.get(axis, axis)
    if axis in ("depth", "heads"):
        what = f"{a['model']} {_shape(a['model'])} to {b['model']} {_shape(b['model'])}"
    elif axis == "density":
        what = f"rho {float(a['density']):g} to {float(b['density']):g}"
    elif axis == "epochs":
        what = f"{int(a['epochs'])} to {int(b['epochs'])} epochs"
    else:
        what = f"the even start to the {START_WORDS.get(b['start'], b['start'])} one"
    fixed = cell_label(a, leave_out=column)
    return f"from {what} (at {fixed}): {_gap_words(a)} to {_gap_words(b)}"


def halves(frame: pd.DataFrame, cell: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A cell's first five paired seeds and the rest (the fresh seeds that confirm them)."""
    own = frame
    for key in CELL:
        own = own[own[key].astype(str) == str(cell[key])]
    seeds = sorted(set(own[own.method == PAIR[0]].seed) & set(own[own.method == PAIR[1]].seed))
    return own[own.seed.isin(seeds[:5])], own[own.seed.isin(seeds[5:])]


def fresh_seed_checks(frame: pd.DataFrame, cells: list[dict]) -> list[tuple[dict, pd.Series, pd.Series]]:
    """(cell, first five seeds, fresh seeds) for every cell ahead on its first five paired
    seeds that has fresh ones (:func:`halves`), each half as a :func:`paired_cells` row."""
    checks = []
    for cell in cells:
        first, fresh = halves(frame, cell)
        if fresh.empty:
            continue
        early = paired_cells(first).iloc[0]
        if standing(early.val_gap, early.val_sem) == "ahead":
            checks.append((cell, early, paired_cells(fresh).iloc[0]))
    return checks


def map_reading(frame: pd.DataFrame, paper: pd.DataFrame) -> str:
    """The map in plain words, composed from its recorded runs ``frame``: how many cells show
    BARTER ahead, level or behind (the paired validation gap beyond the seed noise,
    :func:`~barter_mini.book.seed_noise.standing`, or within it), what each single change of
    setting does to the gap, whether a lead seen on five seeds held on five fresh ones, and
    what that says about the paper's setting."""
    cells = paired_cells(frame)
    if cells.empty:
        return "The map has no recorded cell yet."
    records = cells.to_dict("records")
    states = [standing(c["val_gap"], c["val_sem"]) for c in records]
    counts = {state: states.count(state) for state in ("ahead", "level", "behind", "undecided")}
    undecided = f" ({counts['undecided']} with one seed: undecided)" if counts["undecided"] else ""
    parts = [f"Of the map's {len(records)} cells, BARTER is ahead of Static beyond the seed noise (the paired "
             f"validation gap beyond {RULE}) in {counts['ahead']}, level with it (within the noise) in "
             f"{counts['level']} and behind in {counts['behind']}{undecided}."]
    changes = [(axis, a, b) for a in records for b in records if (axis := _axis_of(a, b))]
    if changes:
        parts.append("\nOne setting changed at a time (validation gap in points, ± its standard error):\n")
        parts += [f"- {AXES[axis]}, {_change_words(axis, a, b)}" for axis, a, b in
                  sorted(changes, key=lambda change: list(AXES).index(change[0]))]
    confirmed, unconfirmed = [], []
    for cell, early, late in fresh_seed_checks(frame, records):
        words = (f"{cell_label(cell)}: {signed(early.val_gap)} ± {early.val_sem:.2f} on its first five seeds, "
                 f"{signed(late.val_gap)} ± {late.val_sem:.2f} on {int(late.seeds)} fresh ones")
        (confirmed if standing(late.val_gap, late.val_sem) == "ahead" else unconfirmed).append(words)
    if unconfirmed:
        parts.append("\nNot confirmed on fresh seeds: " + "; ".join(unconfirmed) + ".")
    if confirmed:
        parts.append("\nConfirmed on fresh seeds: " + "; ".join(confirmed) + ".")
    largest = max(records, key=lambda c: c["val_gap"])
    paper_max = paper.loc[paper["gap"].idxmax()]
    ahead_points = [c["val_gap"] for c, s in zip(records, states) if s == "ahead"]
    if not ahead_points:
        parts.append(f"\nNo cell shows a gain beyond the seed-to-seed noise; the largest mean gap is "
                     f"{signed(largest['val_gap'])} points ({cell_label(largest)}).")
    else:
        parts.append(f"\nThe largest lead beyond the seed noise is {signed(max(ahead_points))} points, "
                     f"against the paper's {signed(paper_max['gap'])} at rho {paper_max['density']:g}.")
    parts.append(f"\nWhat the map does not vary is the task (CIFAR-10's 10 classes against CIFAR-100's 100) and the "
                 f"length at the paper's scale (200 epochs against at most {int(cells['epochs'].max())} here): "
                 f"those are the settings its gains were measured at.")
    return "\n".join(parts)


#: a cell the reader adds (chapter 05's ``map_cells`` parameter): its keys and their defaults
CELL_SPEC = {"model": None, "density": None, "epochs": 3, "seeds": [0, 1, 2, 3, 4], "start": "even"}
#: the map's fixed settings: the book's quick setting on CIFAR-10
MAP_SETTINGS = {"dataset": "cifar10", "recipe": "quick", "train_subset": 15000}


def cell_runs(spec: dict) -> list[RunConfig]:
    """The runs of one cell a reader names (``{"model": "cct-mini-deep", "density": 0.5}``,
    optionally ``epochs``, ``seeds``, ``start``): BARTER and Static per seed at the map's
    settings (:data:`MAP_SETTINGS`)."""
    if not isinstance(spec, dict):
        raise BarterError(f"a map cell is a mapping such as {{model: cct-mini-deep, density: 0.5}}, not {spec!r}")
    unknown = sorted(set(spec) - set(CELL_SPEC))
    missing = [key for key, default in CELL_SPEC.items() if default is None and key not in spec]
    if unknown or missing:
        raise BarterError(f"a map cell has the keys {', '.join(CELL_SPEC)} (model and density required): "
                          + (f"unknown {', '.join(unknown)}" if unknown else f"missing {', '.join(missing)}"))
    cell = {**CELL_SPEC, **spec}
    seeds = check_list("seeds", cell["seeds"], "seeds")
    return [RunConfig(method=method, model=cell["model"], density=cell["density"], seed=seed,
                      epochs=cell["epochs"], start=cell["start"], progress=False, **MAP_SETTINGS).validate()
            for seed in seeds for method in reversed(PAIR)]


def train_cells(specs: list[dict], cache_dir: Path | None = None) -> pd.DataFrame:
    """The runs of the cells ``specs`` (:func:`cell_runs`) as rows of the map's form, trained
    through the run cache (a run trained before is read, not retrained); ``commit`` is left
    empty: these rows are the reader's, not recorded."""
    rows = [map_row({**vars(run), "train_subset": str(run.train_subset)}, cached_train(run, cache_dir), "")
            for spec in specs for run in cell_runs(spec)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def map_headline(frame: pd.DataFrame) -> str:
    """The introduction's one-sentence answer, composed from the recorded runs ``frame``: how
    many cells show BARTER ahead of Static, by how much at most, and whether any lead seen on
    five seeds held on five fresh ones."""
    cells = paired_cells(frame)
    if cells.empty:
        return "The map has no recorded cell yet."
    records = cells.to_dict("records")
    ahead = [c for c in records if standing(c["val_gap"], c["val_sem"]) == "ahead"]
    checks = fresh_seed_checks(frame, records)
    tried = len(checks)
    held = sum(standing(late.val_gap, late.val_sem) == "ahead" for _, _, late in checks)
    seeds = f"{int(cells['seeds'].min())} to {int(cells['seeds'].max())}" if cells["seeds"].nunique() > 1 \
        else f"{int(cells['seeds'].iloc[0])}"
    axes = [AXES[axis] for axis in AXES
            if any(_axis_of(a, b) == axis for a in records for b in records)]
    along = f", along {listed(axes)}" if axes else ""
    text = (f"Over the {len(records)} cells of the map{along} ({seeds} paired seeds each), BARTER is ahead of its "
            f"own frozen allocation (Static) beyond the seed noise in {len(ahead)}")
    if ahead:
        text += f", by at most {signed(max(c['val_gap'] for c in ahead))} points of validation Top-1"
    text += f", and level or behind in {len(records) - len(ahead)}."
    if tried:
        text += (f" Of the {tried} lead{'s' if tried > 1 else ''} seen on five seeds, {held} held on five fresh "
                 "ones.")
    return text
