"""Probing a run's topology updates measures them without changing the run."""

import pytest

from barter_mini.measure.reallocation import probe_run
from barter_mini.training.trainer import RunConfig, train


@pytest.mark.parametrize("method", ["barter", "static"])
def test_probed_run_is_the_plain_run_and_records_every_update(method, tmp_path):
    run = RunConfig(method=method, dataset="digits", recipe="smoke", epochs=2, density=0.3, seed=1, progress=False)
    probed = probe_run(run, images=200, later=(1,))
    plain = train(run, tmp_path)
    assert [h["train_loss"] for h in probed["history"]] == [h["train_loss"] for h in plain["history"]]
    assert [h["val_acc"] for h in probed["history"]] == [h["val_acc"] for h in plain["history"]]
    assert probed["allocation_history"] == plain["allocation_history"]
    importance = probed["probe"]["importance"]
    assert importance and all(len(entry["ffn"]["priority"]) == 4 for entry in importance)
    updates = probed["probe"]["updates"]
    if method == "static":
        assert updates == []
        return
    assert len(updates) == len(plain["allocation_history"]) - 1 > 0
    assert all("1" in update["later"] for update in updates[:-1])      # one step after each update
    for update in updates:
        assert {"before", "after", "kinds", "allocation"} <= set(update)
        for part in update["kinds"].values():
            assert part["units"] > 0
            # a split clone keeps the function: only the noise changes it, to second order
            assert part["after_exact_clone_logit_change"] < 1e-4
            assert part["after_clone"]["loss"] == pytest.approx(update["before"]["loss"], abs=1e-3)
    distances = probed["probe"]["clone_distances"]
    assert distances and all(0 < d["distance"]["1"] < 1 for d in distances if d["distance"])


def test_a_runs_controller_cannot_be_swapped_behind_its_graphed_step():
    from dataclasses import FrozenInstanceError, replace

    from barter_mini.core.method import Static
    from barter_mini.training.run_config import RunConfig
    from barter_mini.training.trainer import build_training

    t = build_training(RunConfig(method="static", dataset="digits", recipe="smoke", epochs=1, density=0.5,
                                 progress=False))
    with pytest.raises(FrozenInstanceError):
        t.controller = Static()
    with pytest.raises(FrozenInstanceError):
        t.parts = replace(t.parts, controller=Static())
    with pytest.raises(FrozenInstanceError):
        t.parts.controller = Static()
    seen = []
    wrapped = build_training(RunConfig(method="static", dataset="digits", recipe="smoke", epochs=1, density=0.5,
                                       progress=False),
                             wrap_controller=lambda c, model, recipe, loaders, device: seen.append(c) or c)
    assert seen == [wrapped.controller]
