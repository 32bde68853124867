"""How a run is scored: Top-1 accuracy and macro-F1 on a loader, over every process's share."""

from __future__ import annotations

import torch
from sklearn.metrics import f1_score
from torch import nn

from ..core.execution import Execution
from . import parallel


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, execution: Execution = Execution()) -> dict[str, float]:
    """Top-1 accuracy and macro-F1 (fractions) of ``model`` on ``loader``, its forward pass in
    the run's precision."""
    model.eval()
    preds, labels = [torch.zeros(0, dtype=torch.long)], [torch.zeros(0, dtype=torch.long)]
    for x, y in loader:
        with execution.autocast(device):
            logits = model(x.to(device))
        preds.append(logits.argmax(dim=1).cpu())
        labels.append(y.cpu())
    pred, true = parallel.gather_predictions(torch.cat(preds), torch.cat(labels))   # this process's share
    pred, true = pred.numpy(), true.numpy()
    return {"acc": float((pred == true).mean()),
            "macro_f1": float(f1_score(true, pred, average="macro", zero_division=0))}
