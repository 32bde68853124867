"""Is there room to reallocate at the book's quick setting, and does BARTER find it?

Static trains a frozen allocation; if no frozen allocation of the same budgets beats the even
one by more than the seed noise, moving units cannot pay on this task however well a method
moves them. The room is ``best frozen - even`` on test, paired by seed, with its standard
error, the best chosen on validation by a search on seeds of its own (so that the seeds that
judge it did not choose it).

The runs, in three stages of one ``barter-mini`` sweep (:func:`room_stages`):

1. on the room's seeds: Static from the even, piled-first and piled-last starts, and BARTER
   from the even start;
2. Static from BARTER's final allocation of the same seed;
3. the search, on :data:`SEARCH_SEEDS`: Static from the even allocation with one block of
   units moved between two layers (:func:`one_block_moves`), every ordered pair of layers, for
   heads and FFN channels;
4. Static from the search's two best moves (on validation) on the room's seeds.

To run them in the background, one job per core::

    nice python -m barter_mini.book.room --jobs 2
    python -m barter_mini.book.room --record COMMIT     # then: data/room.csv

H1 (pre-registered in ``data/README.md``): BARTER's lead over Static comes from the moving,
not from where capacity ends up. Its test (:func:`h1_stages`) trains Static, BARTER and
BARTER's within-layer control (``scope="within-layer"``: the same pruning and cloning, every
clone in its donor's layer) on :data:`H1_SEEDS`, then on the fresh :data:`H1_CONFIRM_SEEDS`::

    nice python -m barter_mini.book.room --h1 --jobs 2
    python -m barter_mini.book.room --h1 --record COMMIT  # then: data/room_h1.csv
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd

from ..core.budgets import Allocation, compute_budget, initial_allocation
from ..core.models import get_model_config
from ..errors import BarterError, OneLineParser, exit_status, positive_int
from ..training.cache import cached_train
from ..training.checkpoints import write_csv_atomically
from ..training.run_config import RunConfig
from ..training.sweep import Stage
from .claims import claim
from .experiments import profile_run
from .profiles import Profile, resolve_profile
from .reallocation_study import VARIANTS, final_allocation
from .recorded_grid import recorded_data_dir
from .seed_noise import paired_summary, standing
from .unit_paths import final_twins, path_rows, update_diagnostics

#: the book's quick setting: cct-mini on 15,000 CIFAR-10 images, 3 epochs
ROOM_PROFILE = "quick"
ROOM_DENSITY = 0.3
#: the seeds that measure the room (paired by seed)
ROOM_SEEDS = tuple(range(10))
#: the seeds the search judges its candidates on, never used to measure the room
SEARCH_SEEDS = (100, 101)
#: the starts Static and BARTER train from on every room seed
STARTS = ("even", "first", "last")
#: the FFN channels one search move carries between two layers (heads move one at a time)
FFN_BLOCK = 8
#: H1's test: seeds no earlier stage used
H1_SEEDS = tuple(range(10, 20))
#: H1's confirmation: seeds its test did not use
H1_CONFIRM_SEEDS = tuple(range(20, 25))
#: BARTER's within-layer control: the same prune-and-clone, no unit leaves its layer
WITHIN_LAYER = {"scope": "within-layer"}
#: BARTER as the method chapter derives it (Taylor score, split moments), and each of its two
#: changes alone: why it loses (the names of reallocation_study.VARIANTS)
DERIVATION_VARIANTS = ("barter as derived", "pruning by Taylor^2", "split clone moments")
#: the settings BARTER as derived changes: the Taylor score and split moments
AS_DERIVED = VARIANTS["barter as derived"].changes


def room_setup() -> Profile:
    return resolve_profile(ROOM_PROFILE, "default", densities=[ROOM_DENSITY], seeds=list(ROOM_SEEDS))


def one_block_moves(even: Allocation, ffn_block: int = FFN_BLOCK) -> dict[str, dict]:
    """Every allocation that is ``even`` with one head, or ``ffn_block`` FFN channels, moved
    from layer i to layer j (i != j), named ``heads 0->2`` / ``ffn 1->3``; a move that would
    empty a layer is left out."""
    moves = {}
    for kind, block in (("heads", 1), ("ffn", ffn_block)):
        counts = list(getattr(even, kind))
        for source in range(len(counts)):
            for target in range(len(counts)):
                if source == target or counts[source] - block < 1:
                    continue
                moved = list(counts)
                moved[source] -= block
                moved[target] += block
                allocation = even.as_dict()
                allocation[kind] = moved
                moves[f"{kind} {source}->{target}"] = allocation
    return moves


def even_allocation(setup: Profile, density: float = ROOM_DENSITY) -> Allocation:
    config = get_model_config(setup.model)
    return initial_allocation(config, compute_budget(config, density))


def start_runs(setup: Profile, seeds=ROOM_SEEDS, density: float = ROOM_DENSITY) -> list[RunConfig]:
    """Stage 1: Static from every start of :data:`STARTS`, and BARTER from the even one."""
    runs = [replace(profile_run(setup, "static", density, seed), start=start)
            for seed in seeds for start in STARTS]
    return runs + [profile_run(setup, "barter", density, seed) for seed in seeds]


def found_allocation_runs(setup: Profile, seeds=ROOM_SEEDS, density: float = ROOM_DENSITY) -> list[RunConfig]:
    """Stage 2: Static from the allocation BARTER ends with on the same seed (read from the
    cache: within a sweep the cache is read-only, so a missing BARTER run is an error)."""
    return [replace(profile_run(setup, "static", density, seed),
                    allocation=final_allocation(setup.cached_train(profile_run(setup, "barter", density, seed))))
            for seed in seeds]


def search_runs(setup: Profile, seeds=SEARCH_SEEDS, density: float = ROOM_DENSITY) -> list[RunConfig]:
    """Stage 3: Static from every one-block move of the even allocation, on the search's seeds
    (the even allocation itself included, as the reference the moves are judged against)."""
    even = even_allocation(setup, density)
    allocations = [None, *one_block_moves(even).values()]
    return [replace(profile_run(setup, "static", density, seed), allocation=allocation)
            for allocation in allocations for seed in seeds]


def label_of(run: RunConfig, moves: dict[str, dict]) -> str:
    """What a room run trains: ``even``, ``piled first``, ``piled last``, ``barter`` (``barter
    within-layer``: H1's control; or a name of :data:`DERIVATION_VARIANTS`), or a
    given allocation named by its move in ``moves`` (:func:`one_block_moves`: ``heads 0->2``)
    or ``barter's allocation``."""
    if run.method == "barter":
        changes = run.method_settings_changes()
        if changes == WITHIN_LAYER:
            return "barter within-layer"
        named = [name for name in DERIVATION_VARIANTS if VARIANTS[name].changes == changes]
        return named[0] if named else "barter"
    if run.allocation is None:
        return "even" if run.start == "even" else f"piled {run.start}"
    for name, allocation in moves.items():
        if allocation == run.allocation:
            return name
    return "barter's allocation"


def runs_frame(runs: list[RunConfig], setup: Profile, twins_too: bool = False) -> pd.DataFrame:
    """One row per run, read from the cache (never trained): label, seed, validation and test
    Top-1 (%), and the heads and FFN channels per layer it ended with; for BARTER, what its
    updates did (:func:`~barter_mini.book.unit_paths.update_diagnostics`) and, with
    ``twins_too``, its :func:`~barter_mini.book.unit_paths.final_twins`."""
    moves = one_block_moves(even_allocation(setup))
    rows = []
    for run in runs:
        metrics = cached_train(run, setup.cache_dir, train_missing=False)
        rows.append({"label": label_of(run, moves), "seed": run.seed, "val_acc": 100 * metrics["val_acc"],
                     "acc": 100 * metrics["test_acc"], **final_allocation(metrics),
                     **({**update_diagnostics(metrics), **(final_twins(run, setup.cache_dir) if twins_too else {})}
                        if run.method == "barter" else {})})
    return pd.DataFrame(rows)


def paired_gaps(frame: pd.DataFrame, reference: str = "even") -> pd.DataFrame:
    """Per label: ``label - reference`` on each seed both have, on validation and test Top-1,
    mean, SE = sd / sqrt(n) and n; sorted by the validation gap, best first."""
    rows = []
    for value in ("val_acc", "acc"):
        by_seed = frame.pivot_table(index="seed", columns="label", values=value)
        for label in by_seed.columns.drop(reference):
            d = (by_seed[label] - by_seed[reference]).dropna()
            gap, _, se = paired_summary(d)
            rows.append({"label": label, "value": value, "gap": gap, "se": se, "n": len(d)})
    gaps = pd.DataFrame(rows).pivot(index="label", columns="value", values=["gap", "se", "n"])
    gaps.columns = [f"{stat}_{'val' if value == 'val_acc' else 'test'}" for stat, value in gaps.columns]
    return gaps.sort_values("gap_val", ascending=False)


def best_moves(setup: Profile, top: int = 2) -> list[str]:
    """The ``top`` one-block moves with the largest validation gap over the even allocation on
    the search's seeds."""
    gaps = paired_gaps(runs_frame(search_runs(setup), setup))
    return list(gaps.index[:top])


def best_move_runs(setup: Profile, seeds=ROOM_SEEDS, top: int = 2) -> list[RunConfig]:
    """Stage 4: Static from the search's best moves, on the room's seeds."""
    moves = one_block_moves(even_allocation(setup))
    return [replace(profile_run(setup, "static", ROOM_DENSITY, seed), allocation=moves[name])
            for name in best_moves(setup, top) for seed in seeds]


def room_stages(setup: Profile | None = None) -> list[Stage]:
    setup = setup or room_setup()
    return [Stage("room: starts", lambda: start_runs(setup)),
            Stage("room: barter's allocation", lambda: found_allocation_runs(setup)),
            Stage("room: one-block search", lambda: search_runs(setup)),
            Stage("room: the search's best on the room's seeds", lambda: best_move_runs(setup))]


def h1_runs(setup: Profile, seeds) -> list[RunConfig]:
    """H1's runs on ``seeds``: Static and BARTER from the even start, and BARTER's within-layer
    control (:data:`WITHIN_LAYER`)."""
    return [run for seed in seeds for run in (
        profile_run(setup, "static", ROOM_DENSITY, seed), profile_run(setup, "barter", ROOM_DENSITY, seed),
        profile_run(setup, "barter", ROOM_DENSITY, seed).with_method_settings(**WITHIN_LAYER))]


def derivation_runs(setup: Profile, seeds=H1_SEEDS) -> list[RunConfig]:
    """BARTER with each change of :data:`DERIVATION_VARIANTS` alone but as derived (its own
    stage, :func:`fresh_seed_runs` trains as derived), on H1's seeds."""
    return [profile_run(setup, "barter", ROOM_DENSITY, seed).with_method_settings(**VARIANTS[name].changes)
            for seed in seeds for name in DERIVATION_VARIANTS[1:]]


def fresh_seed_runs(setup: Profile, seeds=H1_SEEDS) -> list[RunConfig]:
    """On H1's seeds, beside its runs: Static from the start the room's seeds found best
    (piled last, so that the seeds that chose it do not measure it), and BARTER as derived
    (:data:`AS_DERIVED`), paired with the default BARTER of the same seeds."""
    return [run for seed in seeds for run in (
        replace(profile_run(setup, "static", ROOM_DENSITY, seed), start="last"),
        profile_run(setup, "barter", ROOM_DENSITY, seed).with_method_settings(**AS_DERIVED))]


def h1_stages(setup: Profile | None = None) -> list[Stage]:
    setup = setup or room_setup()
    return [Stage("H1: test", lambda: h1_runs(setup, H1_SEEDS)),
            Stage("fresh seeds: piled last and barter as derived", lambda: fresh_seed_runs(setup)),
            Stage("H1: confirmation on fresh seeds", lambda: h1_runs(setup, H1_CONFIRM_SEEDS)),
            Stage("the derivation's two changes alone", lambda: derivation_runs(setup))]


def derivation_summary(path=None) -> dict:
    """What the method chapter says of BARTER as derived, from ``data/room_h1.csv`` on H1's
    seeds: each derivation variant's paired validation gap to the package's BARTER and to
    Static (mean, SE, n), and, per variant, the mean over the seeds of its final twins and net
    displacement per kind and of the share of its heads updates whose receiver is the layer
    of its first (from ``room_h1_path.csv``)."""
    path = Path(path or recorded_data_dir() / "room_h1.csv")
    runs = pd.read_csv(path)
    runs = runs[runs["seed"].isin(H1_SEEDS)]
    moves = pd.read_csv(path.with_name(path.stem + "_path.csv"))
    by_seed = runs.pivot_table(index="seed", columns="label", values="val_acc")
    summary = {}
    for label in ("barter", *DERIVATION_VARIANTS):
        own = runs[runs["label"] == label]
        row = {f"{stat}_{kind}": float(own[f"{stat}_{kind}"].mean())
               for stat in ("twins", "displaced", "repruned") for kind in ("heads", "ffn")}
        row["loss_jump"] = float(own["loss_jump"].mean())
        heads = moves[(moves["label"] == label) & (moves["moved_heads"] > 0)]
        row["same_receiver"] = float(heads.groupby("seed")["receiver_heads"].apply(lambda r: (r == r.iloc[0]).mean()).mean())
        for reference in ("barter", "even"):
            if label != reference:
                gap, _, se = paired_summary((by_seed[label] - by_seed[reference]).dropna())
                row[f"gap_to_{reference}"], row[f"se_to_{reference}"] = gap, se
        summary[label] = row
    return summary


def derivation_substitutions(path=None) -> dict[str, str]:
    """:func:`derivation_summary` as the method chapter's ``{{ derivation_* }}`` substitutions."""
    keys = {"barter": "default", "barter as derived": "derived", "pruning by Taylor^2": "taylor",
            "split clone moments": "split"}
    units = lambda mean: f"{mean:.0f}" if mean == round(mean) else f"{mean:.1f}"
    even = even_allocation(room_setup())
    subs = {"derivation_heads_budget": str(sum(even.heads)), "derivation_ffn_budget": str(sum(even.ffn))}
    summary = derivation_summary(path)
    check_derivation_claims(summary)
    for label, row in summary.items():
        name = keys[label]
        for stat in ("twins", "displaced"):
            for kind in ("heads", "ffn"):
                subs[f"derivation_{name}_{stat}_{kind}"] = units(row[f"{stat}_{kind}"])
        subs[f"derivation_{name}_same_receiver"] = f"{row['same_receiver']:.0%}"
        subs[f"derivation_{name}_repruned_ffn"] = f"{row['repruned_ffn']:.0%}"
        subs[f"derivation_{name}_loss_jump"] = f"{row['loss_jump']:+.3f}"
        for reference in ("barter", "even"):
            if f"gap_to_{reference}" in row:
                subs[f"derivation_{name}_minus_{reference}"] = f"{row[f'gap_to_{reference}']:+.2f} ± {row[f'se_to_{reference}']:.2f}"
    return subs


def check_derivation_claims(summary: dict) -> None:
    """What the method chapter's paragraph on why the derivation loses says of
    :func:`derivation_summary`, checked (:func:`~barter_mini.book.claims.claim`)."""
    default, derived = summary["barter"], summary["barter as derived"]
    taylor, split = summary["pruning by Taylor^2"], summary["split clone moments"]
    for reference in ("even", "barter"):
        claim(f"BARTER as derived is behind {reference} beyond twice its SE on fresh seeds",
              standing(derived[f"gap_to_{reference}"], derived[f"se_to_{reference}"]) == "behind",
              gap=derived[f"gap_to_{reference}"], se=derived[f"se_to_{reference}"])
    claim("as derived has twins of both kinds, the package's BARTER and the Taylor score alone none",
          derived["twins_heads"] > 0 and derived["twins_ffn"] > 0
          and default["twins_heads"] == default["twins_ffn"] == taylor["twins_heads"] == 0)
    claim("with the Taylor score every head update goes to one receiver; with magnitude fewer than half do",
          derived["same_receiver"] == taylor["same_receiver"] == 1.0 and default["same_receiver"] < 0.5
          and split["same_receiver"] < 0.5, default=default["same_receiver"], split=split["same_receiver"])
    claim("as derived keeps all its moved heads moved, the package's BARTER about one",
          derived["displaced_heads"] == 4 and default["displaced_heads"] < 1.5, default=default["displaced_heads"])
    claim("split moments alone make twins of both kinds", split["twins_heads"] > 0 and split["twins_ffn"] > 0)
    claim("later updates prune far more of split moments' FFN clones than of the as-derived ones",
          split["repruned_ffn"] > 3 * derived["repruned_ffn"], split=split["repruned_ffn"], derived=derived["repruned_ffn"])
    claim("an update costs as derived no more loss than the package's BARTER (within 0.005)",
          abs(derived["loss_jump"] - default["loss_jump"]) < 0.005, derived=derived["loss_jump"], default=default["loss_jump"])
    for name, row in (("the Taylor score alone", taylor), ("split moments alone", split)):
        claim(f"{name} is level with Static", standing(row["gap_to_even"], row["se_to_even"]) == "level",
              gap=row["gap_to_even"], se=row["se_to_even"])


#: the command that trains every run of the room
COMMAND = "nice python -m barter_mini.book.room --jobs 2"
#: the command that trains every run of H1 (data/room_h1.csv)
H1_COMMAND = "nice python -m barter_mini.book.room --h1 --jobs 2"


def record(commit: str, path=None, h1: bool = False) -> Path:
    """Every room run's row (:func:`runs_frame`, with ``stage``), ``commit`` and :data:`COMMAND`,
    written atomically to ``data/room.csv`` (H1's stages: ``data/room_h1.csv``), and every
    BARTER run's path (:func:`~barter_mini.book.unit_paths.path_rows`) to
    ``data/room_path.csv`` (``room_h1_path.csv``): the stages in the cache, up to the first that
    is not (its name printed), so that a sweep still running can be recorded as far as it got;
    with none in the cache, a one-line :class:`~barter_mini.errors.BarterError` and no file."""
    setup = room_setup()
    frames, paths = [], []
    moves = one_block_moves(even_allocation(setup))
    for stage in (h1_stages if h1 else room_stages)(setup):
        try:
            runs = stage.runs()
            frames.append(runs_frame(runs, setup, twins_too=h1).assign(stage=stage.name))
            paths += [{"label": label_of(run, moves), "seed": run.seed, **row} for run in runs
                      if run.method == "barter" for row in path_rows(cached_train(run, setup.cache_dir, train_missing=False))]
        except BarterError as missing:
            if not frames:
                raise BarterError(f"nothing to record: the first stage, {stage.name!r}, is not all in the run cache "
                                  f"yet ({missing})") from None
            print(f"recorded up to {stage.name!r}, which is not all in the run cache yet ({missing})")
            break
    frame = pd.concat(frames, ignore_index=True).round(4).assign(commit=commit, command=H1_COMMAND if h1 else COMMAND)
    for kind in ("heads", "ffn"):
        frame[kind] = frame[kind].map(tuple)
    path = Path(path or recorded_data_dir() / ("room_h1.csv" if h1 else "room.csv"))
    if paths:
        path_frame = pd.DataFrame(paths).astype({"receiver_heads": "Int64", "receiver_ffn": "Int64"}).assign(commit=commit)
        write_csv_atomically(path.with_name(path.stem + "_path.csv"), tuple(path_frame.columns),
                             path_frame.to_dict("records"))
    return write_csv_atomically(path, tuple(frame.columns), frame.to_dict("records"))


def commit_name(text: str) -> str:
    """``--record``'s COMMIT: the commit the recorded rows name, one word."""
    if not text or text != text.strip() or any(char.isspace() or not char.isprintable() for char in text):
        raise argparse.ArgumentTypeError(f"expected the commit the rows record, one word such as a git hash, "
                                         f"got {text!r}")
    return text


def main(argv: list[str] | None = None) -> int:
    """``python -m barter_mini.book.room``: train the room's runs (or H1's) into the run cache,
    or record them; every failure is one ``error: ...`` line, exit status 2."""
    from ..training.sweep import ExecutorSettings, run_sweep

    parser = OneLineParser(prog="python -m barter_mini.book.room",
                           description="train the room's runs into the run cache, or record them")
    parser.add_argument("--jobs", type=positive_int, help="runs training at once (default 2)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs a sweep would train; train nothing")
    parser.add_argument("--record", metavar="COMMIT", type=commit_name,
                        help="record the trained runs in data/room.csv instead of training")
    parser.add_argument("--h1", action="store_true", help="H1's test (data/room_h1.csv) instead of the room")
    args = parser.parse_args(argv)
    if args.record is not None:
        training_flags = {"--dry-run": (args.dry_run, "it lists the runs a sweep would train"),
                          "--jobs": (args.jobs, "it sets the runs training at once")}
        given = [f"{flag} ({what})" for flag, (value, what) in training_flags.items() if value]
        if given:
            parser.error(f"--record COMMIT records the runs already in the run cache and trains nothing: "
                         f"leave out {' and '.join(given)}")

        def work() -> int:
            print(record(args.record, h1=args.h1))
            return 0
    else:
        def work() -> int:
            stages = h1_stages() if args.h1 else room_stages()
            report = run_sweep(stages, ExecutorSettings(kind="local", jobs=args.jobs or 2), dry_run=args.dry_run)
            print(report.summary())
            return 0 if args.dry_run or report.complete else 1
    return exit_status(work)


if __name__ == "__main__":
    raise SystemExit(main())
