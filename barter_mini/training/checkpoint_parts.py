"""A checkpoint as a registry of stateful parts: every entry of ``best.pt`` and ``last.pt`` is one
row of :data:`PARTS`.

A row (:class:`Part`) names the entry, the least use that reads it (:data:`USES`: rebuilding the
model, a run's best model, continuing the run), how a run in progress gives it (a
:class:`Stateful`: ``state_dict`` and ``load_state_dict``), what it must be wherever it is read
(``entry``: one line naming the file, :func:`~barter_mini.training.checkpoints.check_checkpoint`)
and its own check before a resumed run loads it (``check``, :func:`check_resume_state`).
:class:`CheckpointManager` over a run's parts (:func:`run_states`) writes a checkpoint and puts a
run back where one left it, both in the rows' order (the model before the optimizer and the
method's controller, every random generator last); the key tuples of each use
(:func:`keys_for`) and an export's entries (:func:`entries_for`) are read off the same rows.

An entry added to the checkpoint is one row here, beside its part's definition, and its test;
:data:`CHECKPOINT_FORMAT` changes with the layout, and a file of another format is one line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from ..core.surgery import allocation_of
from ..errors import BarterError, choose
from ..version import __version__
from .checkpoint_contents import (are_scores, check_entry, check_model_entries, check_weights, finite_number, integer,
                                  is_dict, model_shapes, optional)
from .methods import METHODS
from .progress import PROGRESS_CHECKS
from .random_state import RandomGenerators
from .resume_contents import check_bit_generators, check_generators, check_optimizer, check_scheduler

#: the layout of every checkpoint this version writes and reads (``best.pt``, ``last.pt``, an
#: export): one entry per row of :data:`PARTS`, plain types only (read with ``weights_only=True``)
CHECKPOINT_FORMAT = 4
MODEL_USE, RUN_USE, RESUME_USE = "model", "run", "resume"
#: the uses of a checkpoint, each needing the entries of its own rows and those before it:
#: rebuilding the model (``--init``, an export), a run's best model (``export``, testing it),
#: continuing the run (``last.pt`` with ``--resume``)
USES = (MODEL_USE, RUN_USE, RESUME_USE)


class Stateful(Protocol):
    """What a checkpoint entry is written from and loaded into (torch's modules and optimizers,
    timm's schedulers and the method controllers are such already)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


@dataclass(frozen=True)
class Derived:
    """An entry read off the run's settings or progress (the model's configuration, the epochs
    completed): written for readers that do not resume; a resumed run was built from it or
    restores it through its source, so loading it does nothing."""

    value: Callable[[], Any]

    def state_dict(self) -> Any:
        return self.value()

    def load_state_dict(self, state: Any) -> None:
        pass


@dataclass(frozen=True)
class OptionalPart:
    """A part a run may lack (the fp16 loss scaler): None in the file where the run has none."""

    part: Stateful | None

    def state_dict(self) -> Any:
        return None if self.part is None else self.part.state_dict()

    def load_state_dict(self, state: Any) -> None:
        if self.part is not None:
            self.part.load_state_dict(state)


@dataclass
class Loading:
    """A checkpoint being checked before a run resumes from it: the file, its entries, the
    parameters of each of the optimizer's groups of a model (``parameter_groups(model)``: those
    of :func:`~barter_mini.training.optimization.parameter_groups`, given by the caller, since
    that module imports this one through the run settings and the data) and, once the model's
    row has checked its entries, the model built on the meta device (the optimizer's check
    pairs its moments with that model's parameters)."""

    checkpoint: dict
    path: Path
    parameter_groups: Callable[[torch.nn.Module], list[list]]
    model: torch.nn.Module | None = None


@dataclass(frozen=True)
class Part:
    """One entry of a checkpoint: its ``name``, the least of :data:`USES` that reads it,
    ``state(training)`` the run's :class:`Stateful` for it, ``entry(path, name, value)`` its
    check wherever it is read and ``check(value, loading)`` its own check before it is loaded."""

    name: str
    use: str
    state: Callable[[Any], Stateful]
    entry: Callable[[Path, str, Any], None] | None = None
    check: Callable[[Any, Loading], None] | None = None


def of_kind(check: Callable[[Any], bool], allowed: str) -> Callable[[Path, str, Any], None]:
    """An entry check: ``check(value)`` or a one-line error saying the entry must be ``allowed``."""
    return lambda path, name, value: check_entry(path, name, value, check, allowed)


def check_run_settings(path: Path, name: str, run: Any) -> None:
    """The settings of a run read from the file ``path`` that are looked up or printed before
    the run is compared with any other (``export``: its method and density), refused in one
    line that names the file: a method this version lacks, a density outside (0, 1]."""
    check_entry(path, name, run, is_dict, "a dict of the run's settings")
    if "method" in run:
        try:
            choose("method", run["method"], METHODS)
        except BarterError as error:
            raise BarterError(f"{path}: the run's {error}: the file is damaged or of another version; "
                              "retrain the run") from None
    if "density" in run:
        check_entry(path, "run.density", run["density"], lambda v: finite_number(0.0, 1.0)(v) and v > 0,
                    "a number in (0, 1]")


def _check_model(weights: dict, loading: Loading) -> None:
    """The configuration, allocation and weights against the model built on the meta device."""
    config, allocation = check_model_entries(loading.checkpoint, loading.path)
    loading.model = model_shapes(config, allocation, loading.path, len(weights))
    check_weights(loading.model.state_dict(), weights, loading.path)


def _check_optimizer(saved: dict, loading: Loading) -> None:
    check_optimizer(saved, loading.parameter_groups(loading.model), loading.path)


def _check_length(path: Path, name: str, length: Any) -> None:
    check_entry(path, name, length, is_dict, "a dict of total_steps and epochs")
    for key in ("total_steps", "epochs"):
        check_entry(path, f"{name}.{key}", length.get(key), integer(1), "an integer >= 1")


def _check_progress(state: dict, loading: Loading) -> None:
    """Every entry of :data:`~barter_mini.training.progress.PROGRESS_CHECKS` and how they agree
    with the run's length (``step <= total_steps``, ``epoch <= epochs + 1``) and with the
    top-level ``epoch`` and ``step`` (those of the progress)."""
    path, checkpoint = loading.path, loading.checkpoint
    missing = [name for name in PROGRESS_CHECKS if name not in state]
    if missing:
        raise BarterError(f"{path}: progress lacks {', '.join(missing)}, which resuming the run needs: "
                          "retrain the run (into a new --out)")
    for name, (check, allowed) in PROGRESS_CHECKS.items():
        check_entry(path, f"progress.{name}", state[name], check, allowed)
    total, epochs = checkpoint["length"]["total_steps"], checkpoint["length"]["epochs"]
    check_entry(path, "progress.step", state["step"], lambda step: step <= total,
                f"at most length.total_steps ({total})")
    check_entry(path, "progress.epoch", state["epoch"], lambda epoch: epoch <= epochs + 1,
                f"at most length.epochs + 1 ({epochs + 1})")
    check_entry(path, "step", checkpoint["step"], lambda step: step == state["step"],
                f"progress.step ({state['step']})")
    check_entry(path, "epoch", checkpoint["epoch"], lambda epoch: epoch == state["epoch"] - 1,
                f"progress.epoch - 1 ({state['epoch'] - 1}), the epochs completed")


def _check_rng(states: list, loading: Loading) -> None:
    for number, generators in enumerate(states):
        check_generators(generators, loading.path, f"rng[{number}]")


def _every_process_generators(states) -> bool:
    return isinstance(states, list) and len(states) > 0 and all(
        isinstance(state, dict) and {"python", "numpy", "torch", "cuda"} <= set(state) for state in states)


#: every entry of a checkpoint, in the order it is checked and loaded (``t`` a
#: :class:`~barter_mini.training.trainer.Training`)
PARTS: tuple[Part, ...] = (
    Part("model_config", MODEL_USE, lambda t: Derived(lambda: asdict(t.config))),
    Part("allocation", MODEL_USE, lambda t: Derived(lambda: allocation_of(t.model).as_dict())),
    Part("model", MODEL_USE, lambda t: t.model, check=_check_model),
    Part("optimizer", RESUME_USE, lambda t: t.optimizer, of_kind(is_dict, "a dict (the optimizer's state)"),
         _check_optimizer),
    Part("run", RUN_USE, lambda t: Derived(lambda: asdict(t.run)), check_run_settings),
    Part("controller", RUN_USE, lambda t: t.controller, of_kind(is_dict, "a dict (the method's state)"),
         lambda state, loading: check_bit_generators(state, loading.path, "controller")),
    Part("epoch", RUN_USE, lambda t: Derived(lambda: t.progress.epoch - 1), of_kind(integer(0), "an integer >= 0")),
    Part("val", RUN_USE, lambda t: Derived(lambda: t.progress.last_val),
         of_kind(optional(are_scores), "None or the validation scores {acc, macro_f1} in [0, 1]")),
    Part("recipe", RESUME_USE, lambda t: Derived(lambda: asdict(t.recipe)),
         of_kind(is_dict, "a dict of the recipe's settings")),
    Part("step", RESUME_USE, lambda t: Derived(lambda: t.progress.step), of_kind(integer(0), "an integer >= 0")),
    Part("length", RESUME_USE, lambda t: Derived(lambda: {"total_steps": t.total_steps, "epochs": t.recipe.epochs}),
         _check_length),
    Part("progress", RESUME_USE, lambda t: t.progress, of_kind(is_dict, "a dict (the trainer's progress)"),
         _check_progress),
    Part("scheduler", RESUME_USE, lambda t: t.scheduler, of_kind(is_dict, "a dict (timm's scheduler state)"),
         lambda state, loading: check_scheduler(state, loading.path)),
    Part("scaler", RESUME_USE, lambda t: OptionalPart(t.parts.scaler),
         of_kind(optional(is_dict), "None or a dict (the fp16 loss scaler's state)")),
    Part("diverged", RESUME_USE, lambda t: Derived(lambda: t.progress.diverged)),
    Part("rng", RESUME_USE, lambda t: RandomGenerators(), of_kind(
        _every_process_generators, "a list of every process's generator states (dicts of python, numpy, torch, cuda)"),
         _check_rng),
)
#: the rows by entry name
PART_BY_NAME = {part.name: part for part in PARTS}


def keys_for(use: str) -> tuple[str, ...]:
    """The entries a checkpoint needs for ``use``: those of its rows and of the uses before it
    in :data:`USES`, in the rows' order."""
    needed = USES[:USES.index(use) + 1]
    return tuple(part.name for part in PARTS if part.use in needed)


def entries_for(use: str, source) -> dict:
    """The entries :func:`keys_for` ``use`` names, written from ``source`` by their rows (a run
    in progress, or any object with the attributes those rows read: an export's ``config``
    and ``model``)."""
    return {name: PART_BY_NAME[name].state(source).state_dict() for name in keys_for(use)}


def check_resume_state(checkpoint: dict, path: Path,
                       parameter_groups: Callable[[torch.nn.Module], list[list]]) -> dict:
    """``checkpoint`` (a ``last.pt`` whose entries :func:`~barter_mini.training.checkpoints.load_checkpoint`
    checked for ``RESUME_USE``) if the trainer can continue from it, else a one-line error
    naming ``path`` and the first entry that is wrong: every row's own check, in order (the
    model's against the model built on the meta device, the optimizer's groups and moments,
    the NumPy generators in the method's state, the progress and how it agrees with the
    length, the LR schedule, every random generator)."""
    loading = Loading(checkpoint, Path(path), parameter_groups)
    for part in PARTS:
        if part.check is not None:
            part.check(checkpoint[part.name], loading)
    return checkpoint


def run_states(training) -> dict[str, Stateful]:
    """The :class:`Stateful` of every row of :data:`PARTS` in the run ``training``."""
    return {part.name: part.state(training) for part in PARTS}


class CheckpointManager:
    """A run's parts by entry (``states``, one :class:`Stateful` per row of :data:`PARTS`):
    :meth:`state_dict` is the checkpoint, :meth:`load_state_dict` restores one, both in the
    rows' order."""

    def __init__(self, states: dict[str, Stateful]):
        if set(states) != set(PART_BY_NAME):
            raise ValueError(f"a checkpoint's states are one per part ({', '.join(PART_BY_NAME)}), "
                             f"got {', '.join(states)}")
        self.states = states

    def state_dict(self) -> dict:
        return {"format": CHECKPOINT_FORMAT, "version": __version__,
                **{part.name: self.states[part.name].state_dict() for part in PARTS}}

    def load_state_dict(self, checkpoint: dict) -> None:
        for part in PARTS:
            self.states[part.name].load_state_dict(checkpoint[part.name])
