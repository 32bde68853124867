"""Peak memory of one real training step (Figure 3, right; Tables 6, 8).

On a GPU the CUDA allocator's peak; on the CPU, where PyTorch keeps no allocator peak, the
sum of the distinct storages a step holds, saved activations counted by saved-tensor hooks.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from ..core.recompute import selective_recompute_of


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

    With selective recomputation on (``barter_mini.core.recompute.enable_selective_recompute``),
    whose own saved-tensor hooks would hide the forward's tensors from these (the innermost
    pair alone applies), the counting function observes what the model's hooks keep: the
    LayerNorm and GELU outputs they rebuild in backward count nothing, since the input each
    is rebuilt from is kept (and counted) anyway. The one rebuilt tensor alive at a time
    in backward is not counted, as no transient tensor of backward is.
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
    recompute = selective_recompute_of(model)
    observing = recompute.observed_by(pack) if recompute is not None else nullcontext()
    with observing, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
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
