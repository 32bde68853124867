"""The warm-up policy for new optimizer state: BARTER's clones and the masked methods' regrown weights."""

import copy
from dataclasses import replace

import pytest
import torch

from barter_mini.core.barter import BarterSettings
from barter_mini.core.barter_controller import BarterController
from barter_mini.core.budgets import compute_budget
from barter_mini.core.models import build_model
from barter_mini.core.surgery import allocation_of
from barter_mini.core.warmup import WARMUP_AGE, UpdateWarmup, start_warmup
from barter_mini.errors import BarterError
from barter_mini.masked import MaskedSettings, RigL
from barter_mini.training.recipes import get_recipe

from helpers import TINY_CCT, assert_in_sync, batch


def test_a_new_entrys_updates_ramp_in_linearly_then_are_ordinary():
    torch.manual_seed(0)
    plain = torch.nn.Parameter(torch.randn(6, 4))
    warmed = torch.nn.Parameter(plain.detach().clone())
    optimizers = [torch.optim.AdamW([p], lr=1e-2, weight_decay=0.0) for p in (plain, warmed)]
    grads = [torch.randn(6, 4) for _ in range(8)]
    for p, opt in zip((plain, warmed), optimizers):       # both get the same history
        for g in grads[:3]:
            p.grad = g.clone()
            opt.step()
    new = torch.zeros(6, 4, dtype=torch.bool)
    new[1] = True
    start_warmup(optimizers[1], warmed, new, steps=4)
    warmup = UpdateWarmup(optimizers[1], steps=4)
    for k, g in enumerate(grads[3:], start=1):
        before = plain.detach().clone(), warmed.detach().clone()
        plain.grad, warmed.grad = g.clone(), g.clone()
        optimizers[0].step()
        warmup.before_step()
        optimizers[1].step()
        warmup.after_step()
        step_plain, step_warmed = plain.detach() - before[0], warmed.detach() - before[1]
        torch.testing.assert_close(step_warmed[1], min(1.0, k / 4) * step_plain[1])
        torch.testing.assert_close(step_warmed[~new].view(5, 4), step_plain[~new].view(5, 4))
    assert optimizers[1].state[warmed][WARMUP_AGE].max() == 4


def test_barter_warmup_clones_start_at_age_zero_and_keep_the_budgets():
    torch.manual_seed(0)
    model = build_model(TINY_CCT, 0.5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    settings = BarterSettings(delta_t=3, transfer_multiplier=20.0, min_age=1, clone_moments="warmup",
                              warmup_steps=5)
    controller = BarterController(model, optimizer, total_steps=30, settings=settings)
    x, y = batch(TINY_CCT)
    ages_seen = set()
    for step in range(1, 31):
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        controller.before_step()
        optimizer.step()
        controller.after_step(step)
        assert_in_sync(model, optimizer)
        for state in optimizer.state.values():
            if WARMUP_AGE in state:
                ages_seen |= set(state[WARMUP_AGE].unique().tolist())
    assert sum(controller.executed.values()) > 0
    assert 0.0 in ages_seen and 5.0 in ages_seen             # born at 0, warmed up at 5
    budget = compute_budget(TINY_CCT, 0.5)
    assert (sum(allocation_of(model).heads), sum(allocation_of(model).ffn)) == (budget.heads, budget.ffn)


def test_rigl_warmup_scales_a_regrown_weights_first_step():
    torch.manual_seed(0)
    model = build_model(TINY_CCT, 1.0)
    x, y = batch(TINY_CCT)
    runs = {}
    for policy in ("reset", "warmup"):
        replica = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(replica.parameters(), lr=1e-2)
        dst = RigL(replica, optimizer, 0.5, total_steps=20,
                   settings=MaskedSettings(delta_t=4, regrow_moments=policy, warmup_steps=4), seed=0)
        for step in range(1, 6):                           # the update at step 4, then one more step
            if step == 5:
                before = {n: p.detach().clone() for n, p in replica.named_parameters()}
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(replica(x), y).backward()
            dst.before_step()
            optimizer.step()
            dst.after_step(step)
        runs[policy] = (dst, {n: p.detach() - before[n] for n, p in replica.named_parameters()})
    (dst, reset), (warmed_dst, warmup) = runs["reset"], runs["warmup"]
    grown = dst.history[0]["grown"]
    assert sum(grown.values()) > 0
    for t in dst.tensors:                                  # tensors that grew nothing step alike
        if not grown[t.name]:
            torch.testing.assert_close(warmup[t.name], reset[t.name])
    name = next(n for n, g in grown.items() if g)
    param = dict(warmed_dst.model.named_parameters())[name]
    age = warmed_dst.optimizer.state[param][WARMUP_AGE]
    assert age.min() == 1                                  # the regrown weights' first ramped step
    young = age == 1
    torch.testing.assert_close(warmup[name][young], reset[name][young] / 4)
    torch.testing.assert_close(warmup[name][~young], reset[name][~young])

def test_policies_are_settings_with_one_line_errors():
    barter = replace(get_recipe("smoke", "cct").barter, clone_moments="warmup", warmup_steps=7)
    masked = replace(get_recipe("smoke", "cct").masked, regrow_moments="warmup", warmup_steps=7)
    assert barter.clone_warmup_steps == 7 and masked.regrow_warmup_steps == 7
    with pytest.raises(BarterError, match="regrow_moments"):
        MaskedSettings(regrow_moments="cold").validate()
    with pytest.raises(BarterError, match="clone_moments"):
        BarterSettings(clone_moments="cold").validate()


def test_update_losses_are_the_windows_around_each_update():
    from barter_mini.training.trainer import update_losses
    losses = [float(i) for i in range(1, 31)]            # the loss of step i is i
    windows = update_losses(losses, [4, 20, 29, 40], window=3)
    assert windows == [{"step": 4, "before": [2.0, 3.0, 4.0], "after": [5.0, 6.0, 7.0]},
                       {"step": 20, "before": [18.0, 19.0, 20.0], "after": [21.0, 22.0, 23.0]},
                       {"step": 29, "before": [27.0, 28.0, 29.0], "after": [30.0]}]


def test_control_windows_lie_halfway_between_updates():
    from barter_mini.training.trainer import control_steps
    assert control_steps([40, 80, 120]) == [60, 100]
    assert control_steps([4, 5, 20]) == [12]             # no step between 4 and 5
    assert control_steps([]) == [] and control_steps([40]) == []


def test_a_run_records_its_update_windows_and_update_time(tmp_path):
    from barter_mini.training.trainer import RunConfig, train
    metrics = train(RunConfig(method="rigl", dataset="digits", recipe="smoke", epochs=2, progress=False), tmp_path)
    steps = [u["step"] for u in metrics["update_losses"]]
    assert steps and steps == [r["step"] for r in metrics["mask"]["history"]]
    assert all(len(u["after"]) > 0 for u in metrics["update_losses"])
    controls = [u["step"] for u in metrics["control_losses"]]
    assert controls == [(a + b) // 2 for a, b in zip(steps, steps[1:])] and not set(controls) & set(steps)
    assert metrics["update_time_s"] > 0 and metrics["update_ms_per_step"] > 0
