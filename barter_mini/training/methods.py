"""The method registry: every ``--method`` name, its controller and how it trains.

The trainer, the bench, export, the run cache and the notebooks ask this registry what a
method is; no other module keeps a list of method names.

=================  ===========  ===============================================
name               full width   controller
=================  ===========  ===============================================
dense              yes          :class:`~barter_mini.core.method.Dense` (rho = 1)
set, snfs, rigl,   yes          the masked baselines of :mod:`barter_mini.masked`
srigl, s2vite
static             no           :class:`~barter_mini.core.method.Static`
oneshot            no           :class:`~barter_mini.core.method.OneShot` (needs ``init``)
random-receiver    no           BARTER, receiver drawn at random (Table 12)
random-donor       no           BARTER, donors drawn at random (Table 12)
random-pair        no           BARTER, both drawn at random (Table 12)
barter             no           :class:`~barter_mini.core.barter_controller.BarterController`
=================  ===========  ===============================================

A row also says how the book draws the method (:class:`Look`), which recorded grids it
belongs to and whether the bench measures it by default, so that a new method is its
module, its row here, its glossary entry and its test.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import nn

from ..core.barter import BarterSettings
from ..core.barter_controller import BarterController
from ..core.method import Dense, MethodController, OneShot, Static
from ..errors import BarterError, check_list, choose
from ..masked import RigL, S2ViTE, SET, SNFS, SRigL, MaskedDST, MaskedSettings
from .recipes import Recipe


@dataclass(frozen=True)
class MethodSetup:
    """What a controller is built from: the model and optimizer of a run and its schedule."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    density: float
    total_steps: int
    recipe: Recipe
    seed: int = 0
    #: the model holds a trained dense model's weights (fine-tuning): masks start from them
    from_trained: bool = False
    #: backward runs on a scaled loss (fp16): the gradients are true only once unscaled
    loss_scaled: bool = False


#: the recorded grids a method can belong to (``notebooks/*.plan.yml`` name them
#: ``registry:GRID``): training from scratch (chapter 02) and fine-tuning (chapter 06)
GRIDS = ("from_scratch", "finetuning")


@dataclass(frozen=True)
class Look:
    """How the book draws a method: its ``marker`` and either a fixed RGB ``color`` or a place
    on the hue circle (``hue_slot``, counted from BARTER's red, with an HLS ``lightness`` and
    ``saturation``); :mod:`barter_mini.book.palette` spaces the slots evenly."""

    marker: str
    hue_slot: int | None = None
    lightness: float = 0.5
    saturation: float = 0.6
    color: tuple[float, float, float] | None = None


@dataclass(frozen=True)
class Method:
    """One entry of the registry: everything any other module needs to know of a method.

    ``label``: its name in prose (the paper's spelling, which the glossary defines);
    ``full_width``: the method trains full-size tensors (dense, the masked baselines) rather
    than BARTER's compact ones; ``settings``: the type of its settings in a
    :class:`~barter_mini.training.recipes.Recipe` (None: it has none); ``fixed_density``:
    the density it always trains at, whatever is asked (dense: 1), or None; ``needs_init``:
    it starts only from a trained dense model; ``look``: its colour and marker in every
    figure; ``grids``: the recorded grids it belongs to (of :data:`GRIDS`); ``in_bench``:
    measured by ``barter-mini bench`` and the GPU check unless they are told which methods.
    """

    name: str
    label: str
    controller: type[MethodController]
    full_width: bool
    build: Callable[[MethodSetup], MethodController]
    look: Look
    settings: type | None = None
    fixed_density: float | None = None
    needs_init: bool = False
    grids: frozenset[str] = frozenset()
    in_bench: bool = False

    def __post_init__(self):
        for grid in self.grids:
            choose("grid", grid, GRIDS)

    @property
    def replayable(self) -> bool:
        """Whether its steps can be replayed from CUDA graphs (``--cuda-graphs``): its
        controller does nothing before a step, or says which steps it may replay
        (:meth:`~barter_mini.core.method.MethodController.graph_safe`)."""
        c = self.controller
        return c.graph_safe is not MethodController.graph_safe or c.before_step is MethodController.before_step

    def model_density(self, density: float) -> float:
        """The density of the model this method builds: full width, or compact at ``density``."""
        return 1.0 if self.full_width else density


def _frozen(controller: type[MethodController]):
    return lambda setup: controller()


def _barter(**overrides):
    """BARTER with the recipe's settings and ``overrides`` (the Table 12 ablations are
    options of BARTER, not copies)."""
    def build(setup: MethodSetup) -> BarterController:
        settings = replace(setup.recipe.barter, **overrides)
        return BarterController(setup.model, setup.optimizer, setup.total_steps, settings, seed=setup.seed,
                                loss_scaled=setup.loss_scaled)
    return build


def _masked(controller: type[MaskedDST]):
    """A masked baseline on the recipe's update interval and horizon, so that every dynamic
    method updates on the same schedule."""
    def build(setup: MethodSetup) -> MaskedDST:
        settings = replace(setup.recipe.masked, delta_t=setup.recipe.barter.delta_t, t_end=setup.recipe.barter.t_end)
        return controller(setup.model, setup.optimizer, setup.density, setup.total_steps, settings,
                          seed=setup.seed, init_from_weights=setup.from_trained)
    return build


BOTH_GRIDS = frozenset(GRIDS)


def _masked_row(controller: type[MaskedDST], label: str, look: Look, in_bench: bool = True) -> Method:
    return Method(controller.name, label, controller, full_width=True, build=_masked(controller), look=look,
                  settings=MaskedSettings, grids=BOTH_GRIDS, in_bench=in_bench)


def _barter_row(name: str, label: str, look: Look, **overrides) -> Method:
    return Method(name, label, BarterController, full_width=False, build=_barter(**overrides), look=look,
                  settings=BarterSettings, grids=BOTH_GRIDS if not overrides else frozenset(),
                  in_bench=not overrides)


#: every method, in the order of the book's tables and legends. The hue slots were searched
#: so that no method looks like BARTER under protanomaly, deuteranomaly or tritanomaly, and
#: lightness alternates so that neighbours on the circle differ.
METHODS: dict[str, Method] = {m.name: m for m in (
    Method("dense", "dense", Dense, full_width=True, build=_frozen(Dense), fixed_density=1.0,
           look=Look("o", color=(0.3, 0.3, 0.3)), grids=BOTH_GRIDS, in_bench=True),
    _masked_row(SET, "SET", Look("v", 1, 0.48, 0.65)),
    _masked_row(SNFS, "SNFS", Look("<", 9, 0.32, 0.55), in_bench=False),
    _masked_row(RigL, "RigL", Look("^", 5, 0.45, 0.50)),
    _masked_row(SRigL, "SRigL", Look(">", 7, 0.28, 0.65)),
    _masked_row(S2ViTE, "S2ViTE", Look("P", 6, 0.42, 0.60)),
    Method("static", "Static", Static, full_width=False, build=_frozen(Static), look=Look("s", 8, 0.45, 0.80),
           grids=BOTH_GRIDS, in_bench=True),
    Method("oneshot", "oneshot", OneShot, full_width=False, build=_frozen(OneShot), needs_init=True,
           look=Look("X", 3, 0.70, 0.80), grids=frozenset({"finetuning"})),
    _barter_row("random-receiver", "random receiver", Look("d", 0, 0.70, 0.60), random_receiver=True),
    _barter_row("random-donor", "random donor", Look("h", 2, 0.55, 0.60), random_donor=True),
    _barter_row("random-pair", "random pair", Look("p", 4, 0.32, 0.65), random_receiver=True, random_donor=True),
    _barter_row("barter", "BARTER", Look("*", color=(0.75, 0.0, 0.0))),
)}


def get_method(name: str) -> Method:
    choose("method", name, METHODS)
    return METHODS[name]


def check_methods(methods) -> tuple[str, ...]:
    """``methods`` as a tuple of known names, at least one; a one-line error otherwise."""
    methods = tuple(check_list("methods", methods, f"names from {', '.join(METHODS)}", allow_empty=True))
    if not methods:
        raise BarterError(f"methods must name at least one of {', '.join(METHODS)}")
    for name in methods:
        get_method(name)
    return methods


def methods_where(test: Callable[[Method], bool]) -> tuple[str, ...]:
    """The names of the registry's methods for which ``test(method)`` holds, in its order."""
    return tuple(name for name, method in METHODS.items() if test(method))


def grid_methods(grid: str) -> tuple[str, ...]:
    """The methods of the recorded grid ``grid`` (one of :data:`GRIDS`), in the registry's order."""
    choose("grid", grid, GRIDS)
    return methods_where(lambda method: grid in method.grids)


def bench_methods() -> tuple[str, ...]:
    """The methods ``barter-mini bench`` and the GPU check measure when not told which."""
    return methods_where(lambda method: method.in_bench)
