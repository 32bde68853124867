"""How a run is scored: Top-1 accuracy and macro-F1 on a loader, over every process's share,
and the mean cross-entropy (which tells a diverged model from a poor one)."""

from __future__ import annotations

import torch
from sklearn.metrics import f1_score
from torch import nn

from ..core.execution import Execution
from . import parallel


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, execution: Execution = Execution()) -> dict[str, float]:
    """Top-1 accuracy and macro-F1 (fractions) of ``model`` on ``loader``, its forward pass in
    the run's precision, and ``loss``: the mean cross-entropy of this process's share, averaged
    over the processes (NaN or infinite for a model whose weights overflowed)."""
    model.eval()
    preds, labels = [torch.zeros(0, dtype=torch.long)], [torch.zeros(0, dtype=torch.long)]
    loss_sum, count = 0.0, 0
    for x, y in loader:
        with execution.autocast(device):
            logits = model(x.to(device))
        loss_sum += float(nn.functional.cross_entropy(logits.float(), y.to(device), reduction="sum"))
        count += len(y)
        preds.append(logits.argmax(dim=1).cpu())
        labels.append(y.cpu())
    pred, true = parallel.gather_predictions(torch.cat(preds), torch.cat(labels))   # this process's share
    pred, true = pred.numpy(), true.numpy()
    return {"acc": float((pred == true).mean()),
            "macro_f1": float(f1_score(true, pred, average="macro", zero_division=0)),
            "loss": parallel.mean_over_processes(loss_sum / max(count, 1))[0]}
