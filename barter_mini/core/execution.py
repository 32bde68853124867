"""How a training step executes, chosen alike for every method: eagerly, with the layers
compiled (:mod:`~barter_mini.core.compilation`), with selective activation recomputation
(:mod:`~barter_mini.core.recompute`), not both; in fp32 or with the forward pass and the
loss in bf16 or fp16 (``torch.autocast``). The first three never change the model's
function; they trade compile time or recomputation for step time or memory
(Tables 8, 14). bf16 rounds the activations and the matrix products' inputs to 8 bits of
mantissa; weights, gradients, optimizer states, the statistics and every surgery stay fp32,
so a topology update and its optimizer-state remap are the same under every precision.

fp16 is for GPUs without bf16 (before NVIDIA Ampere): its 5 exponent bits underflow small
gradients, so the loss is multiplied by a running scale before backward and the gradients
divided by it before anyone reads them (``torch.amp.GradScaler``, :meth:`Execution.grad_scaler`);
a step whose scaled gradients overflow is skipped by the optimizer and by the method alike
(:func:`~barter_mini.training.step.training_step`).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import BarterError, choose

from .compilation import compile_layers
from .recompute import enable_selective_recompute


#: the precision of a step's forward pass and loss, by name: the autocast dtype (None: none)
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
#: the precisions whose gradients are computed from a scaled loss (module docstring)
LOSS_SCALED = ("fp16",)


@dataclass(frozen=True)
class Execution:
    """``compile``: the encoder layers through ``torch.compile`` with dynamic shapes;
    ``recompute``: LayerNorm and GELU outputs recomputed in backward instead of saved, and a
    CCT's tokenizer activations rebuilt from the images (``torch.utils.checkpoint``);
    ``precision``: a name of :data:`PRECISIONS` (:meth:`autocast`); ``graphs``: each step
    replayed from a recorded CUDA graph (:mod:`barter_mini.training.graphs`)."""

    compile: bool = False
    recompute: bool = False
    precision: str = "fp32"
    graphs: bool = False

    def __post_init__(self) -> None:
        choose("precision", self.precision, PRECISIONS)
        if self.graphs and (self.compile or self.recompute):
            # a compiled layer brings its own graphs; the recompute's saved-tensor hooks run
            # Python at every backward, which a replay would skip
            raise BarterError("--cuda-graphs cannot be combined with --compile or --recompute; choose one")
        if self.graphs and self.loss_scaling:
            # the scaler decides on the host, after backward, whether the optimizer steps
            raise BarterError(f"--cuda-graphs cannot be combined with precision {self.precision} (its loss "
                              "scaling decides on the host whether to step): use bf16 or fp32")
        if self.compile and self.recompute:
            # the recompute's per-forward module hooks would break Dynamo's graphs at every
            # LayerNorm and GELU; under compile, AOTAutograd's partitioner already chooses
            # what to save and what to recompute
            raise BarterError("--compile and --recompute cannot be combined: a compiled layer's graph "
                              "already decides which activations to recompute; choose one")

    @property
    def name(self) -> str:
        parts = [part for part, on in (("compiled", self.compile), ("recompute", self.recompute),
                                       (self.precision, self.precision != "fp32"), ("graphs", self.graphs)) if on]
        return "+".join(parts) or "eager"

    @property
    def loss_scaling(self) -> bool:
        """Whether a step scales its loss and unscales its gradients (fp16)."""
        return self.precision in LOSS_SCALED

    def autocast(self, device: torch.device | str, cache_enabled: bool = True):
        """The context a step's forward pass and loss run in on ``device``: nothing for fp32,
        ``torch.autocast`` to bf16 or fp16 otherwise (on the CPU too). Backward follows the
        forward's dtypes by itself; the optimizer step runs outside, on fp32 weights."""
        dtype = PRECISIONS[self.precision]
        if dtype is None:
            return nullcontext()
        device = torch.device(device)
        if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            raise BarterError(f"precision {self.precision} needs a GPU with bfloat16 (NVIDIA Ampere or "
                              f"newer); {torch.cuda.get_device_name(device)} has none: use fp16 or fp32")
        return torch.autocast(device.type, dtype=dtype, cache_enabled=cache_enabled)

    def grad_scaler(self, device: torch.device | str) -> torch.amp.GradScaler | None:
        """A fresh loss scaler for a run on ``device`` where this precision needs one (fp16),
        else None. Its state (the scale and its growth counter) is part of a run's checkpoint."""
        return torch.amp.GradScaler(torch.device(device).type) if self.loss_scaling else None

    def apply(self, model: nn.Module) -> nn.Module:
        """Switch ``model`` (in place) to this execution; returns it."""
        if self.recompute:
            enable_selective_recompute(model)
            if hasattr(model, "recompute_stem"):     # a CCT: its tokenizer too (CompactCCT.recompute_stem)
                model.recompute_stem = True
        if self.compile:
            compile_layers(model)
        return model


#: the executions ``barter-mini bench`` can measure side by side, by name (eager, compiled,
#: recompute, graphs, each also in bf16 and, graphs apart, fp16: bf16, compiled+bf16,
#: recompute+bf16, bf16+graphs, fp16, ...)
EXECUTIONS = {execution.name: execution for precision in PRECISIONS for execution in
              (Execution(precision=precision), Execution(compile=True, precision=precision),
               Execution(recompute=True, precision=precision),
               *(() if precision in LOSS_SCALED else (Execution(precision=precision, graphs=True),)))}
