"""What a method needs to decide identically on every process of a data-parallel run.

Under ``torchrun`` every process holds a replica of the model and trains on its share of
each global batch; DDP averages the gradients during ``backward``, so after it every replica
sees the gradient of the whole global batch. A topology or mask update must then make the
same choice on every process, or the replicas stop being replicas: BARTER reads its
statistics from the averaged gradients and takes rank 0's copy before every decision
(:func:`broadcast_`), and every update ends with :func:`check_same_on_every_rank` on the
per-layer widths or the masks, which fails loudly at the first step where processes differ.

Everything here is a no-op in a single process.
"""

from __future__ import annotations

import hashlib
import pickle

import torch
import torch.distributed as dist


class RankDivergence(RuntimeError):
    """The processes of a data-parallel run no longer hold the same topology or masks."""


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main_process() -> bool:
    """Rank 0, the one process that writes checkpoints and metrics (always True in one process)."""
    return rank() == 0


@torch.no_grad()
def broadcast_(tensors, src: int = 0) -> None:
    """Overwrite ``tensors`` in place with process ``src``'s values."""
    if is_distributed():
        for tensor in tensors:
            dist.broadcast(tensor, src=src)


def all_gather(value) -> list:
    """Every process's ``value`` (any picklable object), in rank order."""
    if not is_distributed():
        return [value]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def fingerprint(value) -> str:
    """SHA-256 of a picklable value; tensors are hashed by their bytes on the CPU."""
    def plain(v):
        if torch.is_tensor(v):
            v = v.detach().cpu().contiguous()
            return (str(v.dtype), tuple(v.shape), v.numpy().tobytes())
        if isinstance(v, dict):
            return tuple((k, plain(v[k])) for k in sorted(v))
        if isinstance(v, (list, tuple)):
            return tuple(plain(x) for x in v)
        return v
    return hashlib.sha256(pickle.dumps(plain(value))).hexdigest()


def check_same_on_every_rank(what: str, value, step: int) -> None:
    """Raise :class:`RankDivergence` unless every process holds the same ``value`` (compared
    by :func:`fingerprint`)."""
    prints = all_gather(fingerprint(value))
    if len(set(prints)) > 1:
        shown = ", ".join(f"rank {r}: {p[:12]}" for r, p in enumerate(prints))
        raise RankDivergence(f"the processes disagree on the {what} after the update at step {step} ({shown}): "
                             "a decision was made from statistics that were not synchronized")
