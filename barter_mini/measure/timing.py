"""Step times and the statistics' overhead: the timing primitives of ``barter-mini bench``
(:mod:`barter_mini.measure.bench`) and ``barter-mini overhead``.

Times are medians of interleaved rounds after warm-up, so that ratios taken in one run are
meaningful on a noisy machine.
"""

from __future__ import annotations

import statistics
import time

import torch

from ..core.models import get_model_config
from ..core.unit_statistics import UnitStatistics
from ..training.parts import parts_for_new_model
from ..training.run_config import RunConfig


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device | str = "cpu") -> float:
    """Wall seconds of ``fn()``, with the device's queue drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def statistics_overhead(model_name: str = "cct-paper", density: float = 0.5, batch: int = 32,
                        steps: int = 10, warmup: int = 2, seed: int = 0) -> dict:
    """Step time with and without the statistics hooks, interleaved, medians.

    Each round times one optimizer step with the hooks attached and one without, in
    alternating order, so machine drift hits both alike; ``overhead_percent`` is the ratio of
    medians minus one. On a busy machine that ratio is noisier than the cost it measures,
    so ``hook_time_percent`` also reports the median share of a step spent inside the hooks
    themselves (host time; exact on the CPU, a lower bound on a GPU).
    """
    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = get_model_config(model_name)
    # Static's parts: a compact model that never changes, stepped as train steps it
    run = RunConfig(method="static", model=model_name, density=density, seed=seed, recipe="paper", lr=1e-4)
    parts = parts_for_new_model(run, config, 1, device)
    hooks = UnitStatistics(parts.model)
    x = torch.randn(batch, config.in_chans, config.img_size, config.img_size, device=device)
    y = torch.randint(0, config.num_classes, (batch,), device=device)

    def step() -> None:
        parts.step(x, y, None)

    times = {"with_hooks": [], "without_hooks": []}
    hook_share = []
    for round_ in range(warmup + steps):
        order = ("with_hooks", "without_hooks") if round_ % 2 == 0 else ("without_hooks", "with_hooks")
        for mode in order:
            hooks.attach() if mode == "with_hooks" else hooks.detach()
            hooks.observe_seconds = 0.0
            elapsed = timed(step, device)
            if round_ >= warmup:
                times[mode].append(elapsed)
                if mode == "with_hooks":
                    hook_share.append(hooks.observe_seconds / elapsed)
    hooks.detach()
    with_hooks, without = (statistics.median(times[m]) for m in ("with_hooks", "without_hooks"))
    return {"model": model_name, "density": density, "batch": batch, "steps": steps,
            "device": device.type, "step_s_with_hooks": with_hooks, "step_s_without_hooks": without,
            "overhead_percent": 100 * (with_hooks / without - 1),
            "hook_time_percent": 100 * statistics.median(hook_share)}


def interleaved_times(steps: dict, rounds: int, warmup: int, device: torch.device | str = "cpu") -> dict[str, list[float]]:
    """Seconds of each named callable over ``rounds`` rounds after ``warmup`` untimed ones.

    Every round calls each callable once, in an order rotated by one each round, so a drift
    of the machine (another process, thermal throttling) hits all of them alike; compare
    medians, and ratios taken within one call.
    """
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(warmup + rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            elapsed = timed(steps[name], device)
            if round_ >= warmup:
                times[name].append(elapsed)
    return times


