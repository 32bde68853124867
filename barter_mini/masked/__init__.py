"""Full-tensor masked DST baselines in one harness (SET, SNFS, RigL, SRigL, S2ViTE).

Each method is one short module stating its rule; :mod:`.base` holds what they share
(masks, schedule, keeping masked weights exactly zero under AdamW and SGD momentum) and
:mod:`.selection` the top-k and apportioning rules. All take
``(model, optimizer, density, total_steps, settings=MaskedSettings(), seed=0)`` and
implement :class:`~barter_mini.core.method.MethodController`.
"""

from .base import MaskedDST, MaskedSettings, MaskSchedule, masked_tensors
from .rigl import RigL
from .s2vite import S2ViTE
from .set import SET
from .snfs import SNFS
from .srigl import SRigL

__all__ = ["MaskedDST", "MaskedSettings", "MaskSchedule", "masked_tensors",
           "SET", "SNFS", "RigL", "SRigL", "S2ViTE"]
