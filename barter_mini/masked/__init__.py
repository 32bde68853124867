"""Full-tensor masked DST baselines in one harness (SET, SNFS, RigL, SRigL, S2ViTE).

Each method is one short module stating its rule; :mod:`.base` holds what they share
(masks, schedule, keeping masked weights exactly zero under AdamW and SGD momentum).
All take ``(model, optimizer, density, total_steps, settings=MaskedSettings(), seed=0)``
and are driven by ``before_step()`` / ``after_step(step)``.
"""

from .base import MaskedDST, MaskedSettings, MaskSchedule, masked_tensors
from .rigl import RigL
from .s2vite import S2ViTE
from .set import SET
from .snfs import SNFS
from .srigl import SRigL

MASKED_METHODS: dict[str, type[MaskedDST]] = {"set": SET, "snfs": SNFS, "rigl": RigL, "srigl": SRigL,
                                              "s2vite": S2ViTE}

__all__ = ["MASKED_METHODS", "MaskedDST", "MaskedSettings", "MaskSchedule", "masked_tensors",
           "SET", "SNFS", "RigL", "SRigL", "S2ViTE"]
