"""Where a training step's time goes, by kind of work: the profile behind BARTER's distance
from the FLOPs ideal at low density.

The FLOPs-ideal speedup ``FLOPs(RigL) / FLOPs(BARTER)`` counts matrix products and
attention, the work that shrinks with the density. A step also does work whose size is
set by the embedding width D and the tokens alone, the same for every method at every
density, with almost no FLOPs but a full pass over memory each: LayerNorms, residual adds,
bias adds, the stem (the CCT tokenizer's convolution, pool and ReLU; ViT's patch
embedding). At rho = 0.1 a compact model's products are ten times cheaper, that fixed work
is not, so it takes a growing share of BARTER's step; :func:`ideal_without_fixed_work` says
how close to the ideal BARTER would be if that work cost nothing in both methods.

:func:`step_profile` runs a few steps under ``torch.profiler`` and charges every operator's
own (self) CPU time to a category by the outermost ATen operator it runs under (a ``fill_``
inside ``max_pool2d_with_indices_backward`` is the stem's; the ``copy_`` of a bias inside
``addmm`` is the product's), and to ``optimizer`` or ``method`` where it runs inside the
optimizer's step or the method's own per-step work (BARTER's statistics hooks, a masked
method's gradient and weight masking).
"""

from __future__ import annotations

import os
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from ..core.unit_statistics import PROFILE_LABEL as STATISTICS_LABEL
from ..training.step import METHOD_LABEL         # the label training_step puts on a method's work

#: Kineto, the profiler's backend, logs every start and stop (``USDT: profiler_start``) and,
#: without a GPU, ``gpuGetDeviceCount failed`` to stderr, where the book's pages show them;
#: level 6 is above its highest (the level is read when a profiler first starts, so a caller
#: who set it keeps theirs)
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

#: the categories of work that shrink with the density: matrix products and attention
SCALING = ("matmul", "attention")
#: the fixed width-D work, the same for every method at every density
FIXED = ("layernorm", "stem", "elementwise")
#: every category a step's time is charged to
CATEGORIES = SCALING + FIXED + ("optimizer", "method", "other")

#: outermost ATen operator -> category (prefix match, first hit); the rest is elementwise
_OPERATORS = (
    (("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"), "matmul"),
    (("aten::_scaled_dot_product", "aten::scaled_dot_product"), "attention"),
    (("aten::native_layer_norm", "aten::layer_norm"), "layernorm"),
    (("aten::convolution", "aten::_convolution", "aten::mkldnn_convolution", "aten::conv",
      "aten::max_pool", "aten::relu", "aten::threshold", "aten::clamp_min"), "stem"),
)


def _category_of_operator(name: str) -> str:
    for prefixes, category in _OPERATORS:
        if name.startswith(prefixes):
            return category
    return "elementwise"


def categorize(event) -> str:
    """The category of one profiler event's self time (see the module): the event and its
    ancestors, innermost first, are searched for the optimizer's or a method's label, and
    the outermost ATen operator among them names the rest."""
    outermost_aten, node = None, event
    while node is not None:
        if node.name.startswith("Optimizer."):       # Optimizer.step#..., Optimizer.zero_grad#...
            return "optimizer"
        if node.name in (METHOD_LABEL, STATISTICS_LABEL):
            return "method"
        if node.name.startswith("aten::"):
            outermost_aten = node.name
        node = node.cpu_parent
    return _category_of_operator(outermost_aten) if outermost_aten else "other"


def step_profile(step, steps: int = 3) -> dict[str, float]:
    """Milliseconds per step of each category (:data:`CATEGORIES`) and ``total``, over
    ``steps`` calls of ``step`` (one training step each) under ``torch.profiler`` (CPU
    operator times; on a GPU the host's side of each operator)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for event in prof.events():
        totals[categorize(event)] += event.self_cpu_time_total / 1000
    out = {category: ms / steps for category, ms in totals.items()}
    out["total"] = sum(out.values())
    return out


#: the CUDA runtime calls that launch work: one per kernel, one per replayed graph
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaGraphLaunch")


def device_activity(step, steps: int = 3) -> dict[str, float]:
    """On a GPU: per step of ``step``, the launches the host made (:data:`LAUNCH_CALLS`; a
    replayed CUDA graph is one) and ``device_busy``, the kernels' summed time over the wall
    time of the steps (under the profiler, which slows the host: a lower bound). A step bound
    by launches leaves the GPU idle between small kernels."""
    if not torch.cuda.is_available():
        raise RuntimeError("device_activity profiles a CUDA device; there is none")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - started) * 1e6
    events = prof.events()
    launches = sum(1 for e in events if e.name.startswith(LAUNCH_CALLS))
    kernel_us = sum(e.time_range.elapsed_us() for e in events if e.device_type == DeviceType.CUDA)
    return {"launches_per_step": launches / steps, "device_busy": min(1.0, kernel_us / wall_us)}


def ideal_without_fixed_work(ours: dict, theirs: dict, ideal_speedup: float) -> dict:
    """From two profiles (``ours``: BARTER, ``theirs``: RigL, same density and execution):
    the fixed work's share of each step, and the speedup and efficiency (speedup / FLOPs
    ideal) BARTER would reach if :data:`FIXED` work cost nothing in both,
    ``(T_theirs - F_theirs) / (T_ours - F_ours)``."""
    fixed_ours, fixed_theirs = (sum(p[c] for c in FIXED) for p in (ours, theirs))
    speedup = theirs["total"] / ours["total"]
    without = (theirs["total"] - fixed_theirs) / (ours["total"] - fixed_ours)
    return {"fixed_ms": fixed_ours, "fixed_share": fixed_ours / ours["total"],
            "rigl_fixed_ms": fixed_theirs, "profiled_speedup": speedup,
            "profiled_efficiency": speedup / ideal_speedup,
            "speedup_without_fixed": without, "efficiency_without_fixed": without / ideal_speedup}
