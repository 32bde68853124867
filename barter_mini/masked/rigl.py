"""RigL (Evci et al., 2020): magnitude drop, gradient regrowth.

Rule, per masked tensor at every update: drop the ``n = round(fraction * active)`` active
weights of smallest ``|w|``; grow the ``n`` inactive weights with the largest dense-gradient
magnitude ``|dL/dw|``, read in ``before_step`` at the update step before the gradient is
masked. A weight dropped in this update is not re-picked (unless the tensor has fewer than
``n`` other inactive weights, which needs density above ~0.77). Grown weights start at 0
with zeroed optimizer state.

Reference: google-research/rigl and rigl-torch 0.5.2 (``rigl_torch/RigL.py``): same
schedule (``delta_t`` = 100, ``T_end`` = 75 %, ``alpha`` = 0.3, cosine decay) and scores.
Deviations: (1) initial masks are uniform per tensor, not ERK (see
:mod:`barter_mini.masked.base`); (2) the update follows an ordinary optimizer step instead
of replacing it (rigl-torch skips the optimizer step at update steps), so every method here
takes the same number of optimizer steps; (3) gradients of inactive weights are masked for
Adam as well, and dropped/grown weights get zeroed Adam moments (rigl-torch resets only SGD
momentum); (4) the references rank just-dropped weights together with the inactive ones for
growth (a re-picked one keeps its old value); here they come last.
"""

from __future__ import annotations

import torch

from .base import MaskedTensor, UnstructuredDST


class RigL(UnstructuredDST):
    name = "rigl"
    needs_dense_gradient = True

    def _grow_score(self, t: MaskedTensor) -> torch.Tensor:
        return self.dense_grad(t.name).abs()
