"""Measurements: parameters, FLOPs, step time, peak memory, and the statistics' overhead.

The primitives of ``barter-mini bench`` (:mod:`barter_mini.bench`) and of ``barter-mini
overhead``: times are medians of interleaved rounds after warm-up, so that ratios taken in
one run are meaningful on a noisy machine; memory is measured during a real step.
"""

from __future__ import annotations

import copy
import statistics as stats_lib
import time
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@contextmanager
def unfused_attention(model: nn.Module):
    """Run timm attention as explicit matmuls so FlopCounterMode sees QK^T and AV.

    (The CPU's fused SDPA kernel is not in the counter's table; the unfused path computes
    the same function with countable ``bmm`` calls.)
    """
    blocks = [b.attn for b in getattr(model, "blocks", []) if hasattr(b.attn, "fused_attn")]
    saved = [a.fused_attn for a in blocks]
    for a in blocks:
        a.fused_attn = False
    try:
        yield
    finally:
        for a, s in zip(blocks, saved):
            a.fused_attn = s


def forward_flops_per_image(model: nn.Module) -> int:
    """FLOPs of one forward pass of one image (2 FLOPs per multiply-add), by FlopCounterMode."""
    config = model.config
    param = next(model.parameters())
    x = torch.zeros(1, config.in_chans, config.img_size, config.img_size, device=param.device)
    was_training = model.training
    model.eval()
    with torch.no_grad(), unfused_attention(model), FlopCounterMode(display=False) as counter:
        model(x)
    model.train(was_training)
    return int(counter.get_total_flops())


def training_gflops_per_image(model: nn.Module) -> float:
    """Training GFLOPs per image in the paper's convention: 3 x forward (Tables 7, 9, 15)."""
    return 3 * forward_flops_per_image(model) / 1e9


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
    """Step time with and without the statistics hooks, interleaved, medians (section 4).

    Each round times one optimizer step with the hooks attached and one without, in
    alternating order, so machine drift hits both alike; ``overhead_percent`` is the ratio of
    medians minus one. On a busy machine that ratio is noisier than the cost it measures,
    so ``hook_time_percent`` also reports the median share of a step spent inside the hooks
    themselves (host time; exact on the CPU, a lower bound on a GPU).
    """
    from .configs import get_model_config
    from .models import build_model
    from .statistics import UnitStatistics

    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = get_model_config(model_name)
    model = build_model(config, density).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    statistics = UnitStatistics(model)
    x = torch.randn(batch, config.in_chans, config.img_size, config.img_size, device=device)
    y = torch.randint(0, config.num_classes, (batch,), device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    times = {"with_hooks": [], "without_hooks": []}
    hook_share = []
    for round_ in range(warmup + steps):
        order = ("with_hooks", "without_hooks") if round_ % 2 == 0 else ("without_hooks", "with_hooks")
        for mode in order:
            statistics.attach() if mode == "with_hooks" else statistics.detach()
            statistics.hook_seconds = 0.0
            elapsed = timed(step, device)
            if round_ >= warmup:
                times[mode].append(elapsed)
                if mode == "with_hooks":
                    hook_share.append(statistics.hook_seconds / elapsed)
    statistics.detach()
    with_hooks, without = (stats_lib.median(times[m]) for m in ("with_hooks", "without_hooks"))
    return {"model": model_name, "density": density, "batch": batch, "steps": steps,
            "device": device.type, "step_s_with_hooks": with_hooks, "step_s_without_hooks": without,
            "overhead_percent": 100 * (with_hooks / without - 1),
            "hook_time_percent": 100 * stats_lib.median(hook_share)}


def counted_training_gflops_per_image(model: nn.Module) -> float:
    """FlopCounterMode's own count of one training forward + backward of one image, in GFLOPs.

    A little under the paper's 3 x forward: the backward of the first layer needs no gradient
    of its input, and the counter sees only the matmuls and convolutions (not norms, softmax
    or the optimizer). Counted on a copy, so the model's gradients are untouched.
    """
    replica = copy.deepcopy(model).train()
    config = replica.config
    param = next(replica.parameters())
    x = torch.zeros(1, config.in_chans, config.img_size, config.img_size, device=param.device)
    with unfused_attention(replica), FlopCounterMode(display=False) as counter:
        replica(x).sum().backward()
    return counter.get_total_flops() / 1e9


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


def _storage_key(tensor: torch.Tensor) -> tuple:
    storage = tensor.untyped_storage()
    return (tensor.device.type, storage.data_ptr()), storage.nbytes()


def tensor_bytes(tensors, exclude: set | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and shared storages once)."""
    seen = dict(exclude or {})
    total = 0
    for tensor in tensors:
        key, nbytes = _storage_key(tensor)
        if key not in seen:
            seen[key] = nbytes
            total += nbytes
    return total


def tensors_held_by(obj, depth: int = 4, _seen: set | None = None):
    """Tensors reachable from ``obj``'s attributes, dicts, lists and dataclasses (not modules or
    optimizers: their parameters and state are counted on their own)."""
    _seen = set() if _seen is None else _seen
    if id(obj) in _seen or depth < 0:
        return
    _seen.add(id(obj))
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, (nn.Module, torch.optim.Optimizer, torch.Generator)):
        return
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from tensors_held_by(value, depth - 1, _seen)
    elif isinstance(obj, (list, tuple, set)):
        for value in obj:
            yield from tensors_held_by(value, depth - 1, _seen)
    elif hasattr(obj, "__dict__"):
        for value in vars(obj).values():
            yield from tensors_held_by(value, depth - 1, _seen)


def step_memory(step, model: nn.Module, optimizer: torch.optim.Optimizer, controller=None,
                device: torch.device | str = "cpu", baseline_bytes: int = 0) -> dict[str, float]:
    """Peak memory of one real training step, in MB (Figure 3, right; Tables 6, 8).

    On a GPU: ``torch.cuda.max_memory_allocated`` over the step, less what was allocated
    before the model existed (call it on a freshly built setup after one step, so optimizer
    state exists). On the CPU, where PyTorch keeps no allocator peak, the sum of what a step
    holds at its peak, each part measured during the step: parameters, gradients, optimizer
    state, the method's own tensors (masks, statistics) and every tensor autograd saves for
    backward, recorded by ``saved_tensors_hooks`` (distinct storages, parameters excluded).
    """
    device = torch.device(device)
    parameters = list(model.parameters())
    param_keys = dict(_storage_key(p) for p in parameters)
    saved: dict = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key, nbytes = _storage_key(tensor)
        if key not in param_keys:
            saved[key] = nbytes
        return tensor

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step()
    params = tensor_bytes(parameters)
    grads = tensor_bytes([p.grad for p in parameters if p.grad is not None])
    state = tensor_bytes([v for s in optimizer.state.values() for v in s.values()
                          if torch.is_tensor(v) and v.dim() > 0])
    own = tensor_bytes(tensors_held_by(controller), exclude={**param_keys}) if controller is not None else 0
    activations = sum(saved.values())
    mb = 1024 ** 2
    result = {"params_mb": params / mb, "grads_mb": grads / mb, "optimizer_mb": state / mb,
              "method_state_mb": own / mb, "saved_activations_mb": activations / mb,
              "peak_mem_mb": (params + grads + state + own + activations) / mb,
              "peak_source": "sum of the step's tensors (saved-tensor hooks)"}
    if device.type == "cuda":
        torch.cuda.synchronize()
        result.update(peak_mem_mb=(torch.cuda.max_memory_allocated() - baseline_bytes) / mb,
                      peak_source="torch.cuda.max_memory_allocated")
    return result
