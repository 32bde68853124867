"""Export a trained run in its smallest dense form (paper Tables 7, 9 and 15: exported size).

* BARTER, its ablations and static: the compact timm model exactly as trained.
* S2ViTE: its masked heads and FFN neurons are removed physically, which leaves a compact
  model of the same family; at equal density it has BARTER's parameter count.
* The unstructured masked methods (SET, SNFS, RigL, SRigL) and dense: the full-size model,
  zeros included; dense kernels cannot use unstructured zeros.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from .errors import BarterError
from .io import load_checkpoint, save_checkpoint
from .measure import count_parameters
from .models import CompactTransformer
from .surgery import UNIT_KINDS, regather_units, unit_count, unit_parameters
from .train import model_from_checkpoint

STRUCTURED_MASKED = {"s2vite"}


def live_units(model: CompactTransformer, masks: dict[str, torch.Tensor], layer: int, kind: str) -> torch.Tensor:
    """Units of ``kind`` in ``layer`` whose input parameters keep at least one active weight."""
    block = model.blocks[layer]
    spec = next(s for s in unit_parameters(block, kind) if s.role == "in" and s.name == "weight")
    name = next(n for n, p in model.named_parameters() if p is spec.tensor)
    mask = masks[name].to(torch.bool)
    count = unit_count(block, kind)
    per_unit = mask.any(dim=1).view(spec.blocks, count, spec.width).any(dim=(0, 2))
    alive = torch.nonzero(per_unit).flatten()
    if alive.numel() == 0:
        raise BarterError(f"layer {layer} has no active {kind}: cannot export an empty layer")
    return alive


def remove_masked_units(model: CompactTransformer, masks: dict[str, torch.Tensor]) -> CompactTransformer:
    """Physically drop the heads and FFN channels a structured mask switched off.

    Pruning is the same regather that BARTER's surgery uses, with no optimizer to remap.
    """
    for layer, block in enumerate(model.blocks):
        for kind in UNIT_KINDS:
            alive = live_units(model, masks, layer, kind)
            regather_units(block, kind, alive, torch.ones(alive.numel()))
    return model


def smallest_dense_form(model: CompactTransformer, method: str, masks: dict[str, torch.Tensor] | None):
    """The model as it would be exported: S2ViTE's masked units removed (on a copy), every
    other method's model unchanged."""
    if method in STRUCTURED_MASKED:
        return remove_masked_units(copy.deepcopy(model), masks)
    return model


def export_run(run_dir: str | Path, out: str | Path, checkpoint: str = "best.pt") -> dict:
    """Write ``run_dir``'s model in its smallest dense form to ``out``; return a summary."""
    state = load_checkpoint(Path(run_dir) / checkpoint)
    model = model_from_checkpoint(state).eval()
    method = state["run"]["method"]
    model = smallest_dense_form(model, method, state["masks"])
    exported = {"format": 1, "method": method, "density": state["run"]["density"],
                "model_config": state["model_config"], "allocation": model.allocation().as_dict(),
                "model": model.state_dict()}
    save_checkpoint(Path(out), exported)
    return {"method": method, "density": state["run"]["density"], "params": count_parameters(model),
            "allocation": exported["allocation"], "out": str(out)}
