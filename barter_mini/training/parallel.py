"""One run on several processes: ``torchrun --nproc_per_node N -m barter_mini.cli train ...``.

torchrun starts N processes and sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``;
:func:`process_group` joins them (gloo on the CPU, NCCL on GPUs, one GPU per process). Each
process loads its share of every global batch (:class:`~barter_mini.training.data.loaders.GlobalBatchSampler`)
and of the validation and test sets; DDP averages the gradients in ``backward``, so after it
every replica holds the gradient of the whole global batch and the method's decisions are
made on the same numbers everywhere (:mod:`barter_mini.core.distributed`).

DDP binds its gradient buckets to the parameters it was built with. A BARTER update replaces
the resized tensors, so the trainer builds a new wrapper (:func:`wrap`) after every update
that changed the model: the old one would reduce gradients of tensors that left the model
and miss the new ones. Building it costs a broadcast of rank 0's weights, which are
already equal everywhere (the surgery is deterministic given the same decision), a few
milliseconds per update. The optimizer needs nothing: the surgery already points its
parameter groups at the new tensors.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..core.distributed import all_gather, is_distributed, rank, world_size
from ..errors import BarterError


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def launch_rank() -> int:
    """This process's rank, known before the process group is joined: torchrun's ``RANK``."""
    return int(os.environ.get("RANK", "0")) if launched_by_torchrun() else rank()


@contextmanager
def process_group(device: str):
    """Join the processes torchrun started (nothing in a single process); leave on exit."""
    if not launched_by_torchrun() or dist.is_initialized():
        yield
        return
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()


def process_device(device: torch.device) -> torch.device:
    """This process's device: its own GPU under torchrun (``LOCAL_RANK``), else ``device``."""
    if device.type == "cuda" and is_distributed():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def wrap(model: nn.Module, device: torch.device) -> nn.Module:
    """The module the training step calls: ``model`` itself, or a DDP replica of it."""
    if not is_distributed():
        return model
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def _collective_device() -> torch.device:
    """Where a tensor must live for the process group's collectives: NCCL reduces GPU tensors only."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def mean_over_processes(*values: float) -> list[float]:
    """The mean of each value over the processes (what one process would log for the global batch)."""
    if not is_distributed():
        return list(values)
    summed = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(summed)
    return (summed / world_size()).tolist()


def any_process(flag: bool) -> bool:
    """True on every process when it is True on one (a signal stops all of them at the same step)."""
    if not is_distributed():
        return flag
    value = torch.tensor([int(flag)], device=_collective_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def gather_predictions(predictions: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every process's share of an evaluation set, joined: each image counted once."""
    if not is_distributed():
        return predictions, labels
    shares = all_gather((predictions, labels))
    return torch.cat([p for p, _ in shares]), torch.cat([l for _, l in shares])


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def own_state(states: list, what: str):
    """This process's entry of a per-process list saved in a checkpoint."""
    if len(states) != world_size():
        raise BarterError(f"the checkpoint's {what} were saved by {len(states)} processes, and {world_size()} "
                          "run now: resume with the same number of processes")
    return states[rank()]
