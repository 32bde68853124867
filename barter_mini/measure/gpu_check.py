"""``barter-mini bench --profile paper-gpu``: the GPU check of issue 25 as one command.

Both paper models at the paper's batch sizes (CCT at 128, ViT at 256; Table 14) and a stock
timm ViT-S/16 at 224 pixels, every method and density, each case in three executions side by
side: eager fp32, bf16, and bf16 with the step replayed from CUDA graphs (every method: a
graph replays the steps between updates, each update step runs eagerly). Static and dense are rows of
their own, so BARTER's step is read against its frozen model (the paper's 1.8 %) and against
the full-width model. Every case is also profiled: kernel launches per step and the share of
the step the GPU was busy. Sized to finish within five minutes (by count) on one H100-class
GPU; the rows are written as JSON after every group of cases, so that nothing measured is
lost to a later failure (:func:`run_gpu_check`). Before it starts it prints what it will
measure and how long that should take (:func:`estimated_seconds`), within :data:`BUDGET_S`.

It runs where nothing can be installed, on the machine's own torch, from the source tree::

    PYTHONPATH=. python3 -m barter_mini.cli bench --profile paper-gpu --out gpu.json
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.counting import training_gflops_per_image
from ..core.execution import EXECUTIONS
from ..core.models import build_model, get_model_config
from ..errors import BarterError
from ..training.checkpoints import write_json
from ..training.methods import get_method
from .bench import DEFAULT_DENSITIES, DEFAULT_METHODS, bench, check_bench_arguments

#: the executions every case is measured in, side by side
GPU_EXECUTIONS = ("eager", "bf16", "bf16+graphs")


@dataclass(frozen=True)
class GpuCase:
    model: str
    batch: int
    methods: tuple[str, ...] = DEFAULT_METHODS
    densities: tuple[float, ...] = DEFAULT_DENSITIES


#: what the check measures: the paper's two models at its batch sizes, then a stock ViT-S/16
#: (at rho 0.1 it would keep fewer heads than its 12 layers: 0.2 is its sparsest)
GPU_CHECK = (
    GpuCase("cct-paper", 128),
    GpuCase("vit-paper", 256),
    GpuCase("timm:vit_small_patch16_224", 64, ("dense", "rigl", "static", "barter"), (0.2, 0.5)),
)
#: bench settings of every case: enough timed steps for a median, two sampled updates, two
#: profiled steps
BENCH_SETTINGS = {"steps": 10, "warmup": 3, "segment_steps": 10, "update_samples": 2, "profile_steps": 2}


def check_groups(cases=GPU_CHECK) -> list[tuple[GpuCase, tuple[str, ...], float]]:
    """The groups the check measures one after the other: per model and density, every
    method side by side (so BARTER's step is timed beside RigL's and Static's at the same
    density); dense, trained at rho = 1 only, in its model's first group."""
    groups = []
    for case in cases:
        for i, density in enumerate(case.densities):
            methods = tuple(m for m in case.methods if i == 0 or get_method(m).fixed_density is None)
            groups.append((case, methods, density))
    return groups


#: what the time estimate assumes of an H100-class GPU, none having been measured yet: the
#: rate at which a step's FLOPs run (fp32 without TF32, bf16 on the tensor cores; both far
#: under peak at these sizes), the fixed seconds of a case (building its model and optimizer,
#: the warm-up's first kernels, a graph recording, starting the profiler) and of a timed update
#: (the surgery and the recording after it). Every row records its group's wall seconds
#: (``group_s``), so the first run on a GPU replaces these guesses with measurements.
ASSUMED_TFLOPS = {"fp32": 25.0, "bf16": 100.0}
#: ... the fixed seconds of a case
ASSUMED_CASE_S = 1.0
#: ... the seconds of a timed update and the recording after it
ASSUMED_UPDATE_S = 0.1
#: what the check may take on one H100-class GPU
BUDGET_S = 300


def _steps_per_case() -> int:
    return sum(BENCH_SETTINGS[k] for k in ("steps", "warmup", "segment_steps", "profile_steps")) + 1


def estimated_seconds(cases=GPU_CHECK) -> float:
    """The check's time by count under :data:`ASSUMED_TFLOPS`, :data:`ASSUMED_CASE_S` and
    :data:`ASSUMED_UPDATE_S`: every case's training steps at its model's training FLOPs (the
    paper's count, full width for the masked methods), plus its
    fixed seconds and its timed updates."""
    gflops, seconds = {}, 0.0
    for case, methods, density in check_groups(cases):
        for method, case_density, execution in check_bench_arguments(case.model, methods, [density], case.batch,
                                                                     1, GPU_EXECUTIONS):
            width = get_method(method).model_density(case_density)
            if (case.model, width) not in gflops:
                gflops[case.model, width] = training_gflops_per_image(build_model(get_model_config(case.model), width))
            rate = ASSUMED_TFLOPS[EXECUTIONS[execution].precision] * 1e3
            seconds += gflops[case.model, width] * case.batch * _steps_per_case() / rate
            seconds += ASSUMED_CASE_S + ASSUMED_UPDATE_S * BENCH_SETTINGS["update_samples"]
    return seconds


def check_plan(cases=GPU_CHECK) -> str:
    """What the check will measure, counted before it starts: groups, cases, training steps
    (warm-up, timed, the epoch segment, the profiled ones) and the timed updates."""
    per_case = _steps_per_case()
    counted = [len(check_bench_arguments(case.model, methods, [density], case.batch, BENCH_SETTINGS["steps"],
                                         GPU_EXECUTIONS, BENCH_SETTINGS["profile_steps"]))
               for case, methods, density in check_groups(cases)]
    count = sum(counted)
    return (f"paper-gpu: {len(counted)} groups, {count} cases, about {count * per_case:,} training steps and "
            f"{count * BENCH_SETTINGS['update_samples']} timed updates, estimated {estimated_seconds(cases) / 60:.1f} "
            "min on an H100-class GPU; each group's rows are written as it finishes")


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def run_gpu_check(device: str = "auto", progress: bool = True, cases=GPU_CHECK, out: Path | None = None,
                  measure=bench) -> list[dict]:
    """Every group of :func:`check_groups` through ``measure``
    (:func:`~barter_mini.measure.bench.bench`); one row per model, method, density and
    execution. After each group every row so far is written to ``out`` (atomically, as
    JSON), so a failure or a time limit later loses nothing measured. A group that fails is
    measured again without CUDA graphs (its rows marked ``fallback``) and, failing again,
    leaves one row per case with the one-line ``error``; the check goes on with the next."""
    if device == "cpu" or not torch.cuda.is_available():
        raise BarterError("the paper-gpu profile measures a CUDA GPU (bf16 and CUDA graphs) and there is none "
                          "here: run `barter-mini bench` without --profile on the CPU")
    print(check_plan(cases), flush=True)
    rows = []
    for case, methods, density in tqdm(check_groups(cases), desc="paper-gpu", disable=not progress):
        started, done = time.perf_counter(), len(rows)

        def measured(executions) -> list[dict]:
            return measure(case.model, methods, [density], batch=case.batch, device="cuda", progress=False,
                           executions=executions, **BENCH_SETTINGS)
        try:
            rows += measured(GPU_EXECUTIONS)
        except Exception as error:  # noqa: BLE001 -- any failure of one group (a recording, memory) is a row
            first = _one_line(error)
            eager = tuple(e for e in GPU_EXECUTIONS if not EXECUTIONS[e].graphs)
            try:
                rows += [{**row, "fallback": f"without graphs after {first}"} for row in measured(eager)]
            except Exception as again:  # noqa: BLE001
                rows += [{"model": case.model, "method": method, "density": case_density, "execution": execution,
                          "batch": case.batch, "error": _one_line(again)}
                         for method, case_density, execution in check_bench_arguments(
                             case.model, methods, [density], case.batch, 1, GPU_EXECUTIONS)]
        for row in rows[done:]:
            row["group_s"] = round(time.perf_counter() - started, 3)
        if out is not None:
            write_json(Path(out), rows)
    return rows
