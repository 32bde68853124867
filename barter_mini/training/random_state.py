"""The process's random generators as plain data, so ``last.pt`` holds nothing but plain types.

Python's ``random`` state is a tuple of ints, torch's a uint8 tensor; NumPy's global
generator (the legacy ``RandomState``) gives its MT19937 key as an array, which the
restricted unpickler that reads checkpoints (``weights_only=True``) does not build, so it is
kept as a list of ints and turned back into ``uint32`` on restore. :class:`RandomGenerators` is
the checkpoint's part of them: every process's, since each draws its own augmentations.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from ..core import distributed
from .parallel import own_state


def capture_generators() -> dict:
    """The states of Python's, NumPy's global, torch's CPU and (where present) CUDA generators."""
    numpy_state = np.random.get_state(legacy=False)
    numpy_state["state"] = {"key": numpy_state["state"]["key"].tolist(), "pos": int(numpy_state["state"]["pos"])}
    return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def restore_generators(state: dict) -> None:
    """Put back what :func:`capture_generators` returned."""
    random.setstate(state["python"])
    numpy_state = dict(state["numpy"])
    numpy_state["state"] = {"key": np.asarray(numpy_state["state"]["key"], dtype=np.uint32),
                            "pos": numpy_state["state"]["pos"]}
    np.random.set_state(numpy_state)
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RandomGenerators:
    """Every process's generators as one checkpoint part (``state_dict``: the list of each
    process's :func:`capture_generators`; ``load_state_dict``: this process's entry restored)."""

    def state_dict(self) -> list[dict]:
        return distributed.all_gather(capture_generators())

    def load_state_dict(self, states: list[dict]) -> None:
        restore_generators(own_state(states, "random generators"))
