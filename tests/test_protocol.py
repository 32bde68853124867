"""One method protocol: every registry entry, its controller, and state that resumes exactly."""

import copy

import pytest
import torch

from barter_mini.core.budgets import Allocation
from barter_mini.core.method import MethodController
from barter_mini.core.models import build_model
from barter_mini.training.methods import METHODS, MethodSetup, get_method
from barter_mini.training.recipes import get_recipe
from barter_mini.training.optimization import make_optimizer

from helpers import TINY_CCT, batch

DENSITY, TOTAL_STEPS, SPLIT_AT = 0.5, 24, 9
#: the smoke recipe updates every 2 steps and moves 8x the paper's units: updates both
#: before and after the split
RECIPE = get_recipe("smoke", "cct")


def batches(n: int):
    return [batch(TINY_CCT, n=8, seed=100 + i) for i in range(n)]


def setup(method: str, allocation: Allocation | None = None):
    spec = get_method(method)
    torch.manual_seed(0)
    model = (build_model(TINY_CCT, spec.model_density(DENSITY)) if allocation is None
             else build_model(TINY_CCT, allocation=allocation))
    optimizer = make_optimizer(model, RECIPE)
    controller = spec.build(MethodSetup(model, optimizer, DENSITY, TOTAL_STEPS, RECIPE, seed=3))
    return model, optimizer, controller


def step(model, optimizer, controller, x, y, number: int) -> None:
    optimizer.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    controller.before_step()
    optimizer.step()
    controller.after_step(number)


def test_every_method_has_a_controller_of_the_protocol():
    for name, method in METHODS.items():
        model, _, controller = setup(name)
        assert isinstance(controller, method.controller) and isinstance(controller, MethodController)
        full = sum(model.allocation().heads) == TINY_CCT.depth * TINY_CCT.heads_per_layer
        assert full == method.full_width, name
        assert set(controller.metrics()) == {"transfers_planned", "transfers_executed", "allocation_history", "mask",
                                             "rank_checks"}


@pytest.mark.parametrize("method", [name for name, method in METHODS.items()
                                    if not method.needs_init and method.fixed_density is None])
def test_state_dict_resumes_bitwise(method):
    """Train to the split, save model, optimizer and controller, rebuild everything from the
    saved state, and continue: the weights and the method's record equal an uninterrupted run's."""
    data = batches(TOTAL_STEPS)
    model, optimizer, controller = setup(method)
    for number, (x, y) in enumerate(data[:SPLIT_AT], start=1):
        step(model, optimizer, controller, x, y, number)
    # state_dicts share storage with the live tensors, as torch's do: copy, as torch.save would
    saved = copy.deepcopy({"allocation": model.allocation(), "model": model.state_dict(),
                           "optimizer": optimizer.state_dict(), "controller": controller.state_dict()})

    resumed = setup(method, saved["allocation"])
    resumed[0].load_state_dict(saved["model"])
    resumed[1].load_state_dict(saved["optimizer"])
    resumed[2].load_state_dict(saved["controller"])
    for number, (x, y) in enumerate(data[SPLIT_AT:], start=SPLIT_AT + 1):
        step(model, optimizer, controller, x, y, number)
        step(*resumed, x, y, number)

    assert resumed[0].allocation() == model.allocation()
    for (name, a), (_, b) in zip(model.state_dict().items(), resumed[0].state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert resumed[2].metrics() == controller.metrics()
    if method in ("barter", "random-pair"):
        assert sum(controller.executed.values()) > 0
        assert any(h["step"] > SPLIT_AT for h in controller.history[1:])     # updates after the split
    elif method != "static":
        assert any(r["step"] > SPLIT_AT for r in controller.history)


def test_a_frozen_method_refuses_foreign_state():
    _, _, controller = setup("static")
    with pytest.raises(ValueError, match="keeps no state"):
        controller.load_state_dict({"masks": {}})


def test_changing_steps_are_those_that_change_the_model():
    model, optimizer, controller = setup("barter")
    steps = controller.changing_steps()
    assert steps and all(any(controller.schedule.transfers_at(s).values()) for s in steps)
    assert setup("dense")[2].changing_steps() == [] == setup("static")[2].changing_steps()
    assert setup("rigl")[2].changing_steps() == list(range(2, int(0.75 * TOTAL_STEPS) + 1, 2))


def test_barter_is_static_until_its_first_update():
    """Statistics hooks only read: before the first topology update BARTER's weights are
    Static's bit for bit (same seed, same batches), so any later gap is the updates' doing."""
    static, barter = setup("static"), setup("barter")
    first = barter[2].changing_steps()[0]
    for number, (x, y) in enumerate(batches(first - 1), start=1):
        step(*static, x, y, number)
        step(*barter, x, y, number)
    for (name, a), b in zip(static[0].state_dict().items(), barter[0].state_dict().values()):
        assert torch.equal(a, b), name
    x, y = batches(first)[-1]
    step(*static, x, y, first)
    step(*barter, x, y, first)
    assert static[0].allocation() != barter[0].allocation()      # the update moved units
