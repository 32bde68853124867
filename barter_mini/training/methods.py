"""The method registry: every ``--method`` name, its controller and how it trains.

The trainer, the bench, export, the run cache and the notebooks ask this registry what a
method is; no other module keeps a list of method names.

=================  ===========  ===============================================
name               full width   controller
=================  ===========  ===============================================
dense              yes          :class:`~barter_mini.core.method.Dense` (rho = 1)
static             no           :class:`~barter_mini.core.method.Static`
barter             no           :class:`~barter_mini.core.barter_controller.BarterController`
random-receiver    no           BARTER, receiver drawn at random (Table 12)
random-donor       no           BARTER, donors drawn at random (Table 12)
random-pair        no           BARTER, both drawn at random (Table 12)
oneshot            no           :class:`~barter_mini.core.method.OneShot` (needs ``init``)
set, snfs, rigl,   yes          the masked baselines of :mod:`barter_mini.masked`
srigl, s2vite
=================  ===========  ===============================================
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import nn

from ..core.barter_controller import BarterController
from ..core.method import Dense, MethodController, OneShot, Static
from ..errors import BarterError, check_list, choose
from ..masked import RigL, S2ViTE, SET, SNFS, SRigL, MaskedDST
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


@dataclass(frozen=True)
class Method:
    """One entry of the registry.

    ``full_width``: the method trains full-size tensors (dense, the masked baselines) rather
    than BARTER's compact ones; ``fixed_density``: the density it always trains at, whatever
    is asked (dense: 1), or None; ``needs_init``: it starts only from a trained dense model.
    """

    name: str
    controller: type[MethodController]
    full_width: bool
    build: Callable[[MethodSetup], MethodController]
    fixed_density: float | None = None
    needs_init: bool = False

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


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("dense", Dense, full_width=True, build=_frozen(Dense), fixed_density=1.0),
    Method("static", Static, full_width=False, build=_frozen(Static)),
    Method("oneshot", OneShot, full_width=False, build=_frozen(OneShot), needs_init=True),
    Method("barter", BarterController, full_width=False, build=_barter()),
    Method("random-receiver", BarterController, full_width=False, build=_barter(random_receiver=True)),
    Method("random-donor", BarterController, full_width=False, build=_barter(random_donor=True)),
    Method("random-pair", BarterController, full_width=False,
           build=_barter(random_receiver=True, random_donor=True)),
    *(Method(c.name, c, full_width=True, build=_masked(c)) for c in (SET, SNFS, RigL, SRigL, S2ViTE)),
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
