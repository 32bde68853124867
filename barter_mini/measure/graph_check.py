"""Recording, releasing and recording again a training step's CUDA graph, on a GPU, for one
method: the check that ``make test-gpu`` (``tests/test_graphs_gpu.py``) and ``barter-mini
gpu-lend`` run, each method in a fresh process as a training run would be::

    PYTHONPATH=. python3 -m barter_mini.measure.graph_check barter

A short schedule on ``cct-mini`` (bf16 + graphs, batch 16) whose first two updates fall
within the steps run: BARTER's surgery and RigL's new masks each release the graph and
record anew; Static records once and replays. It fails with the run's graph metrics where a
recording fell back to eager steps, nothing was replayed, or a weight is not finite.
"""

from __future__ import annotations

import json
import sys

import torch

from ..core.execution import EXECUTIONS
from ..errors import BarterError
from .bench import build_training_step

#: the methods checked: a topology update, a mask update, no update
METHODS = ("barter", "rigl", "static")


def record_release_record(method: str, steps_after_second_update: int = 3) -> dict:
    """Train ``method`` through its first two updates under graphs; the graphed step's metrics."""
    if not torch.cuda.is_available():
        raise BarterError("the graph check records CUDA graphs and there is no CUDA GPU here")
    setup = build_training_step("cct-mini", method, 0.5, 16, 400, torch.device("cuda"),
                                execution=EXECUTIONS["bf16+graphs"])
    changing = setup.controller.changing_steps()
    last = changing[1] + steps_after_second_update if len(changing) > 1 else 12
    for step in range(1, last + 1):
        setup.run(step)
    torch.cuda.synchronize()
    metrics = setup.graphed.metrics()
    wanted = 3 if len(changing) > 1 else 1
    problems = [problem for problem, bad in (
        (f"{metrics['graph_fallbacks']} recordings failed", metrics["graph_fallbacks"] > 0),
        ("nothing was replayed", metrics["graph_replays"] == 0),
        (f"{metrics['graph_captures']} recordings, expected at least {wanted}", metrics["graph_captures"] < wanted),
        ("a weight is not finite", not all(torch.isfinite(p).all() for p in setup.model.parameters())))
        if bad]
    if problems:
        raise BarterError(f"{method}'s graphs: {'; '.join(problems)} ({metrics})")
    return {"method": method, "steps": last, **metrics}


def main(argv: list[str] | None = None) -> int:
    (method,) = argv if argv is not None else sys.argv[1:]
    print(json.dumps(record_release_record(method)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
