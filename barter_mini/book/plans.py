"""Each chapter's runs, declared once, as data beside its notebook.

``notebooks/NN_name.plan.yml`` says which runs chapter ``NN`` reads. Its page trains them
(:meth:`ChapterPlan.train`, through the run cache), ``barter-mini sweep --book PROFILE``
lists them (:func:`book_stages`), and each grid under ``recorded:`` is the same chapter run at
other values of its parameters, kept in ``data/NAME_grid.csv``
(:class:`~barter_mini.book.recorded_grid.RecordedGrid`)::

    runs:
      kind: grid                 # every method at every density and seed
      methods: $methods          # "$name": the notebook's parameter `name`
      densities: $densities
      seeds: $seeds
    recorded:
      from_scratch:              # data/from_scratch_grid.csv
        methods: registry:from_scratch   # the methods whose registry row is in this grid
        densities: [0.1, 0.3, 0.7]
        seeds: [0, 1, 2]

A ``kind`` is one of :data:`KINDS`: what its runs are, stage by stage (a run of a later stage
starts from the results of an earlier one: a fine-tuning run from its pretrained model), and
what the page gets back. A notebook without a plan trains nothing through the cache (chapter
00 takes a few steps of its own, chapter 04 measures). A new chapter is its notebook, its plan
and a line of ``_toc.yml``.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from ..errors import BarterError, choose
from ..training.methods import grid_methods
from ..training.run_config import RunConfig
from ..training.sweep import Stage
from .build import REPO, source_notebooks
from .experiments import grid_runs, run_grid
from .finetuning import MATCHED_METHODS, finetuning_runs, matched_run, pretraining_run, run_finetuning
from .optimizer_state import check_policies, policy_run, run_policies
from .profiles import PROFILES, Profile, resolve_profile
from .reallocation_study import BOOK_POOR_START_VARIANTS, VARIANTS, study_defaults, variant_run
from .recorded_grid import RecordedGrid
from .transfer_counts import check_multipliers, multiplier_run, run_multipliers
from .walkthrough import walkthrough_run

#: the stages of the book's runs, by how many other runs' results a run needs first
STAGE_NAMES = ("independent runs", "runs that start from stage 1's results", "runs that need stage 2's results")
#: a plan's file, beside its notebook
PLAN_SUFFIX = ".plan.yml"

Listing = Callable[[], list[RunConfig]]


@dataclass(frozen=True)
class RunKind:
    """What a plan's ``kind`` trains. ``stages(setup, **arguments)``: its runs' listings, one
    per stage; ``train(setup, **arguments)``: trains them (or reads them from the run cache)
    and returns what the page draws; ``table(result)``: the table a recorded grid keeps of it."""

    stages: Callable[..., list[Listing]]
    train: Callable[..., Any]
    table: Callable[[Any], Any] = lambda result: result


def _reallocation_stages(setup: Profile, density: float, seeds, variants) -> list[Listing]:
    seeds, labels = study_defaults(setup.name, seeds, variants)
    shown = list(dict.fromkeys(["static", "barter", *labels, *BOOK_POOR_START_VARIANTS, "static, from barter's end"]))

    def runs(dependent: bool) -> list[RunConfig]:
        return [variant_run(setup, VARIANTS[label], density, seed) for label in shown for seed in seeds
                if (VARIANTS[label].allocation_from is not None) == dependent]
    return [lambda: runs(False), lambda: runs(True)]


def _finetuning_stages(setup: Profile, methods, densities, seeds, compute_matched: bool) -> list[Listing]:
    stages = [lambda: [pretraining_run(setup, seed) for seed in seeds],
              lambda: finetuning_runs(setup, methods, densities, seeds)]
    if compute_matched:
        stages.append(lambda: [matched_run(setup, d, s, m) for m in MATCHED_METHODS for d in densities for s in seeds])
    return stages


#: the kinds of runs a plan may name, by name
KINDS: dict[str, RunKind] = {
    # BARTER at one density and seed, on the profile's own training subset (chapter 01)
    "walkthrough": RunKind(
        stages=lambda setup, density, seed: [lambda: [walkthrough_run(setup, density, seed)]],
        train=lambda setup, density, seed: setup.cached_train(walkthrough_run(setup, density, seed))),
    # every method at every density and seed (dense once, at rho 1): one row per run
    "grid": RunKind(
        stages=lambda setup, methods, densities, seeds: [lambda: grid_runs(setup, methods, densities, seeds)],
        train=lambda setup, methods, densities, seeds: run_grid(setup, methods, densities, seeds, progress=False)),
    # BARTER's and RigL's optimizer-state policies for new units: (runs, loss changes)
    "policies": RunKind(
        stages=lambda setup, policies, density, seeds: [
            lambda: [policy_run(setup, m, p, density, s) for m, p in check_policies(policies) for s in seeds]],
        train=lambda setup, policies, density, seeds: run_policies(setup, policies, density, seeds, progress=False),
        table=lambda result: result[0]),
    # BARTER with the paper's transfer counts times each multiplier (Table 16)
    "multipliers": RunKind(
        stages=lambda setup, multipliers, density, seeds: [
            lambda: [multiplier_run(setup, m, density, s) for m in check_multipliers(multipliers) for s in seeds]],
        train=lambda setup, multipliers, density, seeds: run_multipliers(setup, multipliers, density, seeds,
                                                                         progress=False)),
    # pretraining, fine-tuning every method, and BARTER given RigL's compute (Figure 5)
    "finetuning": RunKind(
        stages=_finetuning_stages,
        train=lambda setup, methods, densities, seeds, compute_matched: run_finetuning(
            setup, methods, densities, seeds, compute_matched, progress=False)),
    # Static and BARTER paired by seed, the design variants, the piled start and Static from
    # BARTER's final allocation (chapter 05; its page trains them variant by variant)
    "reallocation-study": RunKind(stages=_reallocation_stages, train=None),
}


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


#: how a plan names the methods of one of the registry's grids: ``registry:GRID``
REGISTRY_PREFIX = "registry:"


def _registry_methods(value, where: str):
    """``value``, or the methods of the registry's grid it names (``"registry:from_scratch"``,
    :func:`~barter_mini.training.methods.grid_methods`), so that a new method's row puts it
    in the recorded grids."""
    if isinstance(value, str) and value.startswith(REGISTRY_PREFIX):
        try:
            return list(grid_methods(value[len(REGISTRY_PREFIX):]))
        except BarterError as error:
            raise BarterError(f"{where}: {error}") from None
    return value


def _bind(value, parameters: dict, where: str):
    """``value`` with each ``"$name"`` replaced by the notebook's parameter ``name``."""
    if isinstance(value, str) and value.startswith("$"):
        if value[1:] not in parameters:
            raise BarterError(f"{where} names parameter {value[1:]!r}, which the notebook does not have")
        return parameters[value[1:]]
    if isinstance(value, list):
        return [_bind(item, parameters, where) for item in value]
    return value


@dataclass(frozen=True)
class ChapterPlan:
    """A chapter's runs (:attr:`kind` with :attr:`arguments`, some of them ``"$parameter"``)
    and its recorded grids (name -> the parameter values they were trained at)."""

    notebook: Path
    kind: str
    arguments: dict = field(hash=False)
    recorded: dict = field(hash=False, default_factory=dict)

    @property
    def chapter(self) -> str:
        return self.notebook.name[:2]

    @property
    def path(self) -> Path:
        return self.notebook.with_name(self.notebook.stem + PLAN_SUFFIX)

    def parameters(self, overrides: dict | None = None, profile: str | None = None) -> dict:
        """The notebook's default parameters with ``overrides`` applied (:func:`chapter_parameters`)."""
        return chapter_parameters(self.notebook, overrides, profile)

    def bound(self, parameters: dict) -> dict:
        """:attr:`arguments` at the notebook's ``parameters`` (a page passes its ``globals()``)."""
        return {name: _bind(value, parameters, self.path.name) for name, value in self.arguments.items()}

    def setup(self, profile: str, parameters: dict) -> Profile:
        """The profile the runs train under, the parameters checked as the page checks them."""
        densities = parameters["densities"] if "densities" in parameters else [parameters["density"]]
        seeds = parameters["seeds"] if "seeds" in parameters else [parameters["seed"]]
        return resolve_profile(profile, parameters.get("dataset", "default"), densities=densities,
                               seeds=seeds or [0])

    def stages(self, profile: str, parameters: dict) -> list[Listing]:
        """The listings of the runs, one per stage, at ``parameters``."""
        return KINDS[self.kind].stages(self.setup(profile, parameters), **self.bound(parameters))

    def train(self, setup: Profile, parameters: dict):
        """Train the runs (or read them from the run cache) at the page's ``parameters``; what
        the kind returns: a table of one row per run, or a run's metrics."""
        if KINDS[self.kind].train is None:
            raise BarterError(f"runs of kind {self.kind!r} are trained by their page, variant by variant")
        return KINDS[self.kind].train(setup, **self.bound(parameters))

    def table(self, setup: Profile, parameters: dict):
        """The table a recorded grid keeps of :meth:`train`'s result."""
        return KINDS[self.kind].table(self.train(setup, parameters))

    def recorded_grid(self, name: str) -> RecordedGrid:
        """The recorded grid ``name`` of this chapter."""
        choose(f"recorded grid of chapter {self.chapter}", name, self.recorded)
        return RecordedGrid(name, self, dict(self.recorded[name]))


def read_plan(notebook: Path) -> ChapterPlan | None:
    """The plan beside ``notebook`` (None where it has none), its kind and every ``$name``
    checked against the notebook's parameters."""
    path = Path(notebook).with_name(Path(notebook).stem + PLAN_SUFFIX)
    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(data) - {"runs", "recorded"})
    if unknown or "runs" not in data or not isinstance(data["runs"], dict):
        raise BarterError(f"{path} must hold 'runs' (a kind and its arguments) and may hold 'recorded', "
                          f"not {unknown or 'no runs'}")
    arguments = dict(data["runs"])
    kind = arguments.pop("kind", None)
    choose(f"kind of runs in {path.name}", kind, KINDS)
    recorded = {name: {key: _registry_methods(value, path.name) for key, value in (values or {}).items()}
                for name, values in (data.get("recorded") or {}).items()}
    plan = ChapterPlan(Path(notebook), kind, arguments, recorded)
    defaults = notebook_defaults(notebook)
    plan.bound(defaults)
    for name, values in plan.recorded.items():
        plan.parameters(values)       # every recorded parameter is one of the notebook's
    return plan


def chapter_plans(repo: Path = REPO) -> dict[str, ChapterPlan]:
    """Every chapter's plan, by chapter number (chapters without one are left out)."""
    plans = {path.name[:2]: read_plan(path) for path in source_notebooks(repo)}
    return {chapter: plan for chapter, plan in plans.items() if plan is not None}


def chapter_plan(chapter: str, repo: Path = REPO) -> ChapterPlan:
    """Chapter ``chapter``'s plan (``"02"``)."""
    plans = chapter_plans(repo)
    choose("chapter with a plan", chapter, plans)
    return plans[chapter]


def recorded_grids(repo: Path = REPO) -> dict[str, RecordedGrid]:
    """Every recorded grid of every plan, by name."""
    return {name: plan.recorded_grid(name) for plan in chapter_plans(repo).values() for name in plan.recorded}


def listed_runs(listings: list[Listing]) -> list[RunConfig]:
    """The runs of one stage's listings, in order."""
    return [run for listing in listings for run in listing()]


def book_stages(profile: str, chapters=None, repo: Path = REPO, parameters: dict | None = None) -> list[Stage]:
    """The stages of the runs ``barter-mini book --profile PROFILE`` reads, for the
    notebooks whose number is in ``chapters`` (None: all of them), each at its default
    parameters or, with ``parameters``, at those values (every chosen notebook with a plan
    must have every name: a recorded grid is one chapter run so)."""
    choose("profile", profile, PROFILES)
    notebooks = {path.name[:2]: path for path in source_notebooks(repo)}
    if not notebooks:
        raise BarterError(f"no notebooks in {repo / 'notebooks'}: --book needs this package's source checkout")
    chosen = list(notebooks) if chapters is None else list(chapters)
    for chapter in chosen:
        choose("chapter", chapter, notebooks)
    plans = chapter_plans(repo)
    by_stage: list[list[Listing]] = [[] for _ in STAGE_NAMES]
    for chapter in chosen:
        if chapter not in plans:
            continue
        plan = plans[chapter]
        for depth, listing in enumerate(plan.stages(profile, plan.parameters(parameters))):
            by_stage[depth].append(listing)
    return [Stage(f"{depth + 1} ({name})", lambda listings=listings: listed_runs(listings))
            for depth, (name, listings) in enumerate(zip(STAGE_NAMES, by_stage)) if listings]
