"""``barter-mini bench --profile paper-gpu``: the GPU check as one command.

Both paper models at the paper's batch sizes (CCT at 128, ViT at 256; Table 14) and a stock
timm ViT-S/16 at 224 pixels, every method and density, each case in three executions side by
side: eager fp32, bf16, and bf16 with the step replayed from CUDA graphs (every method: a
graph replays the steps between updates, each update step runs eagerly). Static and dense are rows of
their own, so BARTER's step is read against its frozen model (the paper's 1.8 %) and against
the full-width model. Every case is also profiled: kernel launches per step and the share of
the step the GPU was busy. Sized to finish within five minutes (by count) on one H100-class
GPU. Each model is measured in a process of its own (a CUDA error that poisons a process
stays inside one model), a method that fails costs no other method its rows (it is measured
alone, then without graphs), and the rows are written as JSON after every group of cases, so
that nothing measured is lost to a later failure (:func:`run_gpu_check`). Before it starts it prints what it will
measure and how long that should take (:func:`estimated_seconds`), within :data:`BUDGET_S`.

It runs where nothing can be installed, on the machine's own torch, from the source tree::

    PYTHONPATH=. python3 -m barter_mini.cli bench --profile paper-gpu --out gpu.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.counting import training_gflops_per_image
from ..core.execution import EXECUTIONS
from ..core.models import build_model, get_model_config
from ..errors import BarterError
from ..training.checkpoints import write_json
from ..training.methods import bench_methods, get_method
from .bench import DEFAULT_DENSITIES, bench, check_bench_arguments
from .processes import child_environment, last_error_line

#: the executions every case is measured in, side by side
GPU_EXECUTIONS = ("eager", "bf16", "bf16+graphs")


@dataclass(frozen=True)
class GpuCase:
    model: str
    batch: int
    methods: tuple[str, ...] = field(default_factory=bench_methods)
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


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def error_rows(case: GpuCase, methods, density: float, error: str) -> list[dict]:
    """One row per (method, execution) of a group that could not be measured, with ``error``."""
    return [{"model": case.model, "method": method, "density": case_density, "execution": execution,
             "batch": case.batch, "error": error}
            for method, case_density, execution in check_bench_arguments(case.model, methods, [density], case.batch,
                                                                         1, GPU_EXECUTIONS)]


def measure_group(case: GpuCase, methods: tuple[str, ...], density: float, measure=bench) -> list[dict]:
    """One group's rows: every method side by side (timed interleaved); if that fails, each
    method alone (rows marked ``measured_alone``), and a method that fails alone is measured
    again without CUDA graphs (``fallback``) and, failing again, leaves its error rows. One
    method's failure costs no other method its rows, Static's and the headline ratio
    included."""
    def measured(chosen, executions) -> list[dict]:
        return measure(case.model, list(chosen), [density], batch=case.batch, device="cuda", progress=False,
                       executions=executions, **BENCH_SETTINGS)
    try:
        return measured(methods, GPU_EXECUTIONS)
    except Exception as error:  # noqa: BLE001 -- any failure of the group (a recording, memory) is recorded
        together = one_line(error)
    rows = []
    eager = tuple(e for e in GPU_EXECUTIONS if not EXECUTIONS[e].graphs)
    for method in methods:
        try:
            rows += [{**row, "measured_alone": f"after {together}"} for row in measured((method,), GPU_EXECUTIONS)]
            continue
        except Exception as error:  # noqa: BLE001
            alone = one_line(error)
        try:
            rows += [{**row, "measured_alone": f"after {together}", "fallback": f"without graphs after {alone}"}
                     for row in measured((method,), eager)]
        except Exception as again:  # noqa: BLE001
            rows += error_rows(case, (method,), density, one_line(again))
    return rows


def measure_model(case: GpuCase, out: Path | None = None, measure=bench, progress: bool = False) -> list[dict]:
    """Every group of ``case`` (:func:`check_groups`) through :func:`measure_group`, in this
    process. After each group, the rows so far, appended to those ``out`` already holds, are
    written to ``out`` (atomically, as JSON): what this model measured survives its process."""
    before = json.loads(Path(out).read_text()) if out is not None and Path(out).exists() else []
    rows = []
    for _, methods, density in tqdm(check_groups((case,)), desc=case.model, disable=not progress):
        started, done = time.perf_counter(), len(rows)
        rows += measure_group(case, methods, density, measure)
        for row in rows[done:]:
            row["group_s"] = round(time.perf_counter() - started, 3)
        if out is not None:
            write_json(Path(out), before + rows)
    return rows


def child_command(case: GpuCase, out: Path) -> list[str]:
    """How :func:`model_in_own_process` starts the process that measures ``case``."""
    return [sys.executable, "-m", "barter_mini.measure.gpu_check", json.dumps(asdict(case)), str(out)]


#: the lines of a measuring process's error output kept to name why it failed
KEPT_ERROR_LINES = 20


def model_in_own_process(case: GpuCase, out: Path, command=child_command) -> list[dict]:
    """``case`` measured by :func:`measure_model` in a process of its own, which appends its
    rows to ``out`` group by group: a CUDA error that poisons a process (an illegal address,
    sticky for the rest of it) stays inside one model. Its error output passes through; if
    the process fails, each case it did not measure gets an error row naming the last error
    line it printed."""
    before = len(json.loads(out.read_text())) if out.exists() else 0
    child = subprocess.Popen(command(case, out), stderr=subprocess.PIPE, text=True, env=child_environment())
    kept: deque[str] = deque(maxlen=KEPT_ERROR_LINES)
    for line in child.stderr:
        sys.stderr.write(line)
        kept.append(line.rstrip())
    child.wait()
    rows = json.loads(out.read_text())[before:] if out.exists() else []
    if child.returncode != 0:
        reason = f"the measuring process failed: {last_error_line(kept) or f'exit status {child.returncode}'}"
        measured = {(r["method"], r["density"], r["execution"]) for r in rows}
        for _, methods, density in check_groups((case,)):
            rows += [row for row in error_rows(case, methods, density, reason)
                     if (row["method"], row["density"], row["execution"]) not in measured]
    return rows


def run_gpu_check(device: str = "auto", progress: bool = True, cases=GPU_CHECK, out: Path | None = None,
                  measure_one=None) -> list[dict]:
    """Every model of ``cases`` measured in a process of its own
    (:func:`model_in_own_process`; ``measure_one(case, out)`` instead, if given), one after
    the other; one row per model, method, density and execution. Each process appends its
    groups' rows to ``out`` as they finish (atomically, as JSON), so a failure or a time
    limit later loses nothing measured; within a group, a failing method is measured alone
    and then without graphs (:func:`measure_group`). The rows are written to ``out`` once
    more at the end, with the error rows of a failed process."""
    if device == "cpu" or not torch.cuda.is_available():
        raise BarterError("the paper-gpu profile measures a CUDA GPU (bf16 and CUDA graphs) and there is none "
                          "here: run `barter-mini bench` without --profile on the CPU")
    print(check_plan(cases), flush=True)
    with tempfile.TemporaryDirectory(prefix="paper-gpu-") as scratch:
        target = Path(out) if out is not None else Path(scratch) / "rows.json"
        if target.exists():
            target.unlink()                      # this check's rows, not an earlier one's
        rows = []
        for case in tqdm(cases, desc="paper-gpu", disable=not progress):
            rows += (measure_one or model_in_own_process)(case, target)
            write_json(target, rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    """The measuring process of :func:`model_in_own_process`: ``CASE_JSON OUT``."""
    case_json, out = (argv if argv is not None else sys.argv[1:])
    fields = json.loads(case_json)
    case = GpuCase(fields["model"], fields["batch"], tuple(fields["methods"]), tuple(fields["densities"]))
    measure_model(case, Path(out), progress=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
