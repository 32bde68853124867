"""SET (Mocanu et al., 2018): magnitude drop, random regrowth.

Rule, per masked tensor at every update: drop the ``n = round(fraction * active)`` active
weights of smallest ``|w|``; grow ``n`` weights chosen uniformly at random among the inactive
ones (seeded). New weights start at zero with zeroed optimizer state.

Reference: the SET variant of google-research/rigl (``SparseSETOptimizer``: magnitude drop,
random growth, RigL's cosine-decayed drop fraction), which is the SET of the RigL and BARTER
comparisons. Deviations: Mocanu's original (and sparse_learning's ``SET`` prune mode) removes
the smallest positive and the largest negative weights separately; here the drop is by
``|w|``, as in the RigL code base, so SET and RigL differ only in how they grow. Random
growth prefers weights that were inactive before the update (see
:mod:`barter_mini.masked.base`), where the references draw among all non-kept weights.
"""

from __future__ import annotations

import torch

from .base import MaskedTensor, UnstructuredDST


class SET(UnstructuredDST):
    name = "set"

    def _grow_score(self, t: MaskedTensor) -> torch.Tensor:
        return torch.rand(t.param.shape, generator=self.generator).to(t.param.device)
