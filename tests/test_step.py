"""One training step for everyone: the trainer, the bench, the overhead timing and the book's
walkthrough all build their parts with ``training.parts.build_parts`` and step through
``RunParts.step`` (``training.step.training_step``, or its graph); the bench's step and the
trainer's give bitwise the same weights from the same state."""

from itertools import cycle, islice

import pytest
import torch

from barter_mini.core.surgery import allocation_of
from barter_mini.measure.bench import TrainingStep, run_step
from barter_mini.training.step import training_step
from barter_mini.training.trainer import RunConfig, build_training, train_step

from helpers import TINY_CCT, batch, tiny_model


@pytest.mark.parametrize("method", ["barter", "rigl"])
def test_the_bench_steps_exactly_as_the_trainer_does(method):
    """Twelve steps (BARTER moves units, RigL regrows masks every two in the smoke recipe)
    from two identically built runs: the trainer's ``train_step`` on one, the bench's
    ``TrainingStep.run`` on the other with the same LR schedule."""
    run = RunConfig(method=method, model="cct-mini", dataset="digits", recipe="smoke", epochs=2, density=0.5,
                    seed=3, progress=False)
    trainer, twin = build_training(run), build_training(run)
    bench_step = TrainingStep(method, trainer.run.density, twin.parts, x=None, y=None)
    changed = 0
    for step, (x, y) in enumerate(islice(cycle(trainer.loaders[0]), 12), start=1):
        rng = torch.get_rng_state()                  # drop path draws from it: the same draws for both
        before = allocation_of(trainer.model) if method == "barter" else None
        train_step(trainer, x, y)
        changed += method == "barter" and allocation_of(trainer.model) != before
        torch.set_rng_state(rng)
        bench_step.x, bench_step.y = x, y
        bench_step.run(step)
        twin.scheduler.step_update(step)
    assert method != "barter" or changed > 0
    assert trainer.progress.step == 12
    ours, theirs = trainer.model.state_dict(), twin.model.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    for p, q in zip(trainer.model.parameters(), twin.model.parameters()):
        for name, value in trainer.optimizer.state[p].items():
            assert torch.equal(value, twin.optimizer.state[q][name]), name


def _settings(parts) -> dict:
    """What a run's parts are, apart from the tensors' values and shapes and the learning rate
    now (the trainer's schedule has set its warm-up's)."""
    return {"optimizer": type(parts.optimizer),
            "groups": [({k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr")},
                        len(group["params"]))
                       for group in parts.optimizer.param_groups],
            "controller": type(parts.controller), "changes at": parts.controller.changing_steps(),
            "loss": (type(parts.criterion), parts.criterion.label_smoothing), "execution": parts.execution,
            "scaler": parts.scaler, "graphed": parts.graphed}


@pytest.mark.parametrize("method", ["barter", "rigl", "static"])
def test_the_bench_and_the_trainer_build_equal_parts_from_one_run_config(method):
    run = RunConfig(method=method, model="cct-mini", dataset="digits", recipe="smoke", epochs=2, density=0.5,
                    seed=3, lr=3e-4, progress=False, device="cpu")
    trainer = build_training(run)
    bench = run_step(run, batch=4, total_steps=trainer.total_steps, device=torch.device("cpu"))
    ours, theirs = _settings(trainer.parts), _settings(bench.parts)
    assert ours == theirs
    assert [g["initial_lr"] for g in trainer.optimizer.param_groups] == [3e-4] * 2
    assert [g["lr"] for g in bench.optimizer.param_groups] == [3e-4] * 2 and ours["groups"][0][0]["fused"]
    assert method != "barter" or len(ours["changes at"]) > 0


def test_a_check_before_backward_stops_the_step_there():
    model = tiny_model(TINY_CCT)
    optimizer = torch.optim.AdamW(model.parameters())
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = batch(TINY_CCT)

    def refuse(loss, logits):
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        training_step(model, optimizer, x, y, check_loss=refuse)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    outcome = training_step(model, optimizer, x, y)
    assert outcome.changed is None and outcome.loss.item() > 0
    assert not all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
