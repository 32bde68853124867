"""Parameter and FLOP counts of a model (paper Tables 7, 9, 15; Figure 4).

FLOPs come from ``torch.utils.flop_counter.FlopCounterMode``; the paper's training cost
convention is 3 x forward. The trainer records these counts in every run's metrics, so they
sit in the core, below training and measurement.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@contextmanager
def unfused_attention(model: nn.Module):
    """Run timm attention as explicit matmuls so FlopCounterMode sees QK^T and AV.

    (The CPU's fused SDPA kernel is not in the counter's table; the unfused path computes
    the same function with countable ``bmm`` calls.)
    """
    blocks = [b.attn for b in getattr(model, "blocks", []) if hasattr(b.attn, "fused_attn")]
    saved = [a.fused_attn for a in blocks]
    for a in blocks:
        a.fused_attn = False
    try:
        yield
    finally:
        for a, s in zip(blocks, saved):
            a.fused_attn = s


def forward_flops_per_image(model: nn.Module) -> int:
    """FLOPs of one forward pass of one image (2 FLOPs per multiply-add), by FlopCounterMode."""
    config = model.config
    param = next(model.parameters())
    x = torch.zeros(1, config.in_chans, config.img_size, config.img_size, device=param.device)
    was_training = model.training
    model.eval()
    with torch.no_grad(), unfused_attention(model), FlopCounterMode(display=False) as counter:
        model(x)
    model.train(was_training)
    return int(counter.get_total_flops())


def training_gflops_per_image(model: nn.Module) -> float:
    """Training GFLOPs per image in the paper's convention: 3 x forward (Tables 7, 9, 15)."""
    return 3 * forward_flops_per_image(model) / 1e9


def counted_training_gflops_per_image(model: nn.Module) -> float:
    """FlopCounterMode's own count of one training forward + backward of one image, in GFLOPs.

    A little under the paper's 3 x forward: the backward of the first layer needs no gradient
    of its input, and the counter sees only the matmuls and convolutions (not norms, softmax
    or the optimizer). Counted on a copy, so the model's gradients are untouched.
    """
    replica = copy.deepcopy(model).train()
    config = replica.config
    param = next(replica.parameters())
    x = torch.zeros(1, config.in_chans, config.img_size, config.img_size, device=param.device)
    with unfused_attention(replica), FlopCounterMode(display=False) as counter:
        replica(x).sum().backward()
    return counter.get_total_flops() / 1e9
