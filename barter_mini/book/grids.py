"""The training runs the book's notebooks read, as stages of a sweep (``barter-mini sweep --book``).

``book_stages(profile)`` lists, for every notebook of ``notebooks/`` at its default
parameters (read from its papermill ``parameters`` cell, exactly what ``barter-mini book
--profile PROFILE`` executes) and the profile, the runs it trains through the run cache, with
the notebooks' own functions (:func:`~barter_mini.book.experiments.grid_runs`,
:func:`~barter_mini.book.reallocation_study.variant_run`, ...), so a sweep writes the same
cache folders the notebooks read. Runs that depend on other runs' results come in later
stages, listed only once the earlier ones are in the cache:

1. every run that needs no other run: chapters 01, 02, 03, 07, 08, chapter 05's variants
   from the even or piled start, chapter 06's pretraining;
2. chapter 05's Static from the allocation BARTER ends with, chapter 06's fine-tuning runs
   (from the stage-1 pretrained checkpoint);
3. chapter 06's compute-matched BARTER (RigL's cumulative PFLOPs from stage 2).

Not covered, because they are measurements the notebook makes itself and never caches:
chapter 04's benchmark (step times on the rendering machine) and chapter 05's probed runs
(:func:`~barter_mini.measure.reallocation.probe_run`, trained inside the notebook).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Callable

from ..errors import BarterError, choose
from ..training.sweep import Stage
from ..training.run_config import RunConfig
from .build import REPO, source_notebooks
from .experiments import ABLATION_METHODS, grid_runs
from .finetuning import finetuning_runs, matched_run, pretraining_run
from .optimizer_state import check_policies, policy_run
from .profiles import PROFILES, resolve_profile
from .reallocation_study import BOOK_POOR_START_VARIANTS, VARIANTS, study_defaults, variant_run
from .transfer_counts import check_multipliers, multiplier_run
from .walkthrough import walkthrough_run

#: the stages of the book's runs, by how many other runs' results a run needs first
STAGE_NAMES = ("independent runs", "runs that start from stage 1's results", "runs that need stage 2's results")


def notebook_defaults(path: Path) -> dict:
    """The default values of a notebook's papermill ``parameters`` cell."""
    notebook = json.loads(Path(path).read_text())
    for cell in notebook["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            tree = ast.parse("".join(cell["source"]))
            return {node.targets[0].id if isinstance(node, ast.Assign) else node.target.id:
                    ast.literal_eval(node.value)
                    for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None}
    raise BarterError(f"{path} has no cell tagged 'parameters'")


def chapter_parameters(path: Path, overrides: dict | None = None, profile: str | None = None) -> dict:
    """A notebook's parameters: its defaults (:func:`notebook_defaults`) with ``overrides``
    applied, as ``papermill -p NAME VALUE`` would; a name the notebook lacks is a one-line
    :class:`~barter_mini.errors.BarterError` listing the ones it has."""
    parameters = notebook_defaults(path)
    for name, value in (overrides or {}).items():
        if name not in parameters or name == "profile":
            allowed = ", ".join(n for n in parameters if n != "profile")
            raise BarterError(f"notebook {Path(path).name} has no parameter {name!r} to set: it has {allowed}")
        parameters[name] = value
    if profile is not None:
        parameters["profile"] = profile
    return parameters


def listed_runs(listings: list[Callable[[], list[RunConfig]]]) -> list[RunConfig]:
    """The runs of one stage's listing functions, in order."""
    return [run for listing in listings for run in listing()]


def _walkthrough(profile: str, p: dict) -> list[list[Callable[[], list[RunConfig]]]]:
    setup = resolve_profile(profile, p["dataset"], densities=[p["density"]], seeds=[p["seed"]])
    return [[lambda: [walkthrough_run(setup, p["density"], p["seed"])]]]


def _from_scratch(profile: str, p: dict):
    setup = resolve_profile(profile, p["dataset"], densities=p["densities"], seeds=p["seeds"])
    return [[lambda: grid_runs(setup, p["methods"], p["densities"], p["seeds"])]]


def _ablations(profile: str, p: dict):
    setup = resolve_profile(profile, p["dataset"], densities=[p["density"]], seeds=p["seeds"])
    return [[lambda: grid_runs(setup, ABLATION_METHODS, [p["density"]], p["seeds"])]]


def _reallocation(profile: str, p: dict):
    seeds, labels = study_defaults(profile, p["seeds"], p["variants"])
    setup = resolve_profile(profile, p["dataset"], densities=[p["density"]], seeds=seeds)
    shown = list(dict.fromkeys(["static", "barter", *labels, *BOOK_POOR_START_VARIANTS,
                                "static, from barter's end"]))

    def runs(dependent: bool) -> list[RunConfig]:
        return [variant_run(setup, VARIANTS[label], p["density"], seed) for label in shown for seed in seeds
                if (VARIANTS[label].allocation_from is not None) == dependent]
    return [[lambda: runs(False)], [lambda: runs(True)]]


def _finetuning(profile: str, p: dict):
    setup = resolve_profile(profile, p["dataset"], densities=p["densities"], seeds=p["seeds"])
    stages = [[lambda: [pretraining_run(setup, seed) for seed in p["seeds"]]],
              [lambda: finetuning_runs(setup, p["methods"], p["densities"], p["seeds"])]]
    if p["compute_matched"]:
        stages.append([lambda: [matched_run(setup, d, s) for d in p["densities"] for s in p["seeds"]]])
    return stages


def _optimizer_state(profile: str, p: dict):
    setup = resolve_profile(profile, p["dataset"], densities=[p["density"]], seeds=p["seeds"])
    pairs = check_policies(p["policies"])
    return [[lambda: [policy_run(setup, m, policy, p["density"], s) for m, policy in pairs for s in p["seeds"]]]]


def _transfer_counts(profile: str, p: dict):
    setup = resolve_profile(profile, p["dataset"], densities=[p["density"]], seeds=p["seeds"])
    multipliers = check_multipliers(p["multipliers"])
    return [[lambda: [multiplier_run(setup, m, p["density"], s) for m in multipliers for s in p["seeds"]]]]


#: notebook file name prefix -> its runs, as lists of listing functions per stage
CHAPTERS = {"01": _walkthrough, "02": _from_scratch, "03": _ablations, "05": _reallocation,
            "06": _finetuning, "07": _optimizer_state, "08": _transfer_counts}
#: the notebooks that train nothing through the run cache: measurements only (04), or a few
#: steps of their own in the page (00, BARTER from scratch)
MEASURING_CHAPTERS = ("00", "04")


def book_stages(profile: str, chapters=None, repo: Path = REPO, parameters: dict | None = None) -> list[Stage]:
    """The stages of the runs ``barter-mini book --profile PROFILE`` reads, for the
    notebooks whose number is in ``chapters`` (None: all of them), each at its default
    parameters or, with ``parameters``, at those values (every chosen notebook must have
    every name: a recorded grid, :mod:`~barter_mini.book.recorded_grid`, is one chapter run so)."""
    choose("profile", profile, PROFILES)
    notebooks = {path.name[:2]: path for path in source_notebooks(repo)}
    if not notebooks:
        raise BarterError(f"no notebooks in {repo / 'notebooks'}: --book needs this package's source checkout")
    chosen = list(notebooks) if chapters is None else list(chapters)
    for chapter in chosen:
        choose("chapter", chapter, notebooks)
    by_stage: list[list[Callable[[], list[RunConfig]]]] = [[] for _ in STAGE_NAMES]
    for chapter in chosen:
        if chapter in MEASURING_CHAPTERS:
            continue
        if chapter not in CHAPTERS:
            raise BarterError(f"notebook {notebooks[chapter].name} has no run listing in barter_mini.book.grids: "
                              "add one to CHAPTERS")
        values = chapter_parameters(notebooks[chapter], parameters)
        for depth, listings in enumerate(CHAPTERS[chapter](profile, values)):
            by_stage[depth] += listings
    return [Stage(f"{depth + 1} ({name})", lambda listings=listings: listed_runs(listings))
            for depth, (name, listings) in enumerate(zip(STAGE_NAMES, by_stage)) if listings]
