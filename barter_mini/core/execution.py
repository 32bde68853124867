"""How a training step executes, chosen alike for every method: eagerly, with the layers
compiled (:mod:`~barter_mini.core.compilation`), with selective activation recomputation
(:mod:`~barter_mini.core.recompute`), not both. None of them changes the model's function;
they trade compile time or recomputation for step time or memory (issue 13; Tables 8, 14).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..errors import BarterError

from .compilation import compile_layers
from .recompute import enable_selective_recompute


@dataclass(frozen=True)
class Execution:
    """``compile``: the encoder layers through ``torch.compile`` with dynamic shapes;
    ``recompute``: LayerNorm and GELU outputs recomputed in backward instead of saved, and a
    CCT's tokenizer activations rebuilt from the images (``torch.utils.checkpoint``)."""

    compile: bool = False
    recompute: bool = False

    def __post_init__(self) -> None:
        if self.compile and self.recompute:
            # the recompute's per-forward module hooks would break Dynamo's graphs at every
            # LayerNorm and GELU; under compile, AOTAutograd's partitioner already chooses
            # what to save and what to recompute
            raise BarterError("--compile and --recompute cannot be combined: a compiled layer's graph "
                              "already decides which activations to recompute; choose one")

    @property
    def name(self) -> str:
        parts = [part for part, on in (("compiled", self.compile), ("recompute", self.recompute)) if on]
        return "+".join(parts) or "eager"

    def apply(self, model: nn.Module) -> nn.Module:
        """Switch ``model`` (in place) to this execution; returns it."""
        if self.recompute:
            enable_selective_recompute(model)
            if hasattr(model, "recompute_stem"):     # a CCT: its tokenizer too (CompactCCT.recompute_stem)
                model.recompute_stem = True
        if self.compile:
            compile_layers(model)
        return model


#: the executions ``barter-mini bench`` can measure side by side, by name
EXECUTIONS = {execution.name: execution for execution in
              (Execution(), Execution(compile=True), Execution(recompute=True))}
