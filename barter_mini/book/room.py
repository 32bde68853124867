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
   heads and FFN channels.

To run them in the background, one job per core::

    nice python -m barter_mini.book.room --jobs 2
"""

from __future__ import annotations

from dataclasses import replace

from ..core.budgets import Allocation, compute_budget, initial_allocation
from ..core.models import get_model_config
from ..training.cache import cached_train
from ..training.run_config import RunConfig
from ..training.sweep import Stage
from .experiments import profile_run
from .profiles import Profile, resolve_profile
from .reallocation_study import final_allocation

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
                    allocation=final_allocation(cached_train(profile_run(setup, "barter", density, seed))))
            for seed in seeds]


def search_runs(setup: Profile, seeds=SEARCH_SEEDS, density: float = ROOM_DENSITY) -> list[RunConfig]:
    """Stage 3: Static from every one-block move of the even allocation, on the search's seeds
    (the even allocation itself included, as the reference the moves are judged against)."""
    even = even_allocation(setup, density)
    allocations = [None, *one_block_moves(even).values()]
    return [replace(profile_run(setup, "static", density, seed), allocation=allocation)
            for allocation in allocations for seed in seeds]


def room_stages(setup: Profile | None = None) -> list[Stage]:
    setup = setup or room_setup()
    return [Stage("room: starts", lambda: start_runs(setup)),
            Stage("room: barter's allocation", lambda: found_allocation_runs(setup)),
            Stage("room: one-block search", lambda: search_runs(setup))]


if __name__ == "__main__":
    import argparse

    from ..training.sweep import ExecutorSettings, run_sweep

    parser = argparse.ArgumentParser(description="train the room's runs into the run cache")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    report = run_sweep(room_stages(), ExecutorSettings(kind="local", jobs=args.jobs), dry_run=args.dry_run)
    print(report.summary())
