"""``barter-mini bench --profile paper-gpu``: the GPU check of issue 25 as one command.

Both paper models at the paper's batch sizes (CCT at 128, ViT at 256; Table 14) and a stock
timm ViT-S/16 at 224 pixels, every method and density, each case in three executions side by
side: eager fp32, bf16, and bf16 with the step replayed from CUDA graphs (every method: a
graph replays the steps between updates, each update step runs eagerly). Static and dense are rows of
their own, so BARTER's step is read against its frozen model (the paper's 1.8 %) and against
the full-width model. Every case is also profiled: kernel launches per step and the share of
the step the GPU was busy. Sized to finish well inside eight minutes on one H100/H200-class
GPU; the rows are written as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..errors import BarterError
from .bench import DEFAULT_DENSITIES, DEFAULT_METHODS, bench

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


def run_gpu_check(device: str = "auto", progress: bool = True, cases=GPU_CHECK) -> list[dict]:
    """Every case of ``cases`` through :func:`~barter_mini.measure.bench.bench` (see the
    module); one row per model, method, density and execution."""
    if device == "cpu" or not torch.cuda.is_available():
        raise BarterError("the paper-gpu profile measures a CUDA GPU (bf16 and CUDA graphs) and there is none "
                          "here: run `barter-mini bench` without --profile on the CPU")
    rows = []
    for case in tqdm(cases, desc="paper-gpu", disable=not progress):
        rows += bench(case.model, case.methods, case.densities, batch=case.batch, device="cuda",
                      progress=False, executions=GPU_EXECUTIONS, **BENCH_SETTINGS)
    return rows
