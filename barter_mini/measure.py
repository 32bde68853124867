"""Measurements: parameters, training FLOPs per image, and the statistics' overhead."""

from __future__ import annotations

import statistics as stats_lib
import time
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


def _timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def statistics_overhead(model_name: str = "cct-paper", density: float = 0.5, batch: int = 32,
                        steps: int = 10, warmup: int = 2, seed: int = 0) -> dict:
    """Step time with and without the statistics hooks, interleaved, medians (section 4).

    Each round times one optimizer step with the hooks attached and one without, in
    alternating order, so machine drift hits both alike; ``overhead_percent`` is the ratio of
    medians minus one. On a busy machine that ratio is noisier than the cost it measures,
    so ``hook_time_percent`` also reports the median share of a step spent inside the hooks
    themselves (host time; exact on the CPU, a lower bound on a GPU).
    """
    from .configs import get_model_config
    from .models import build_model
    from .statistics import UnitStatistics

    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = get_model_config(model_name)
    model = build_model(config, density).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    statistics = UnitStatistics(model)
    x = torch.randn(batch, config.in_chans, config.img_size, config.img_size, device=device)
    y = torch.randint(0, config.num_classes, (batch,), device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    times = {"with_hooks": [], "without_hooks": []}
    hook_share = []
    for round_ in range(warmup + steps):
        order = ("with_hooks", "without_hooks") if round_ % 2 == 0 else ("without_hooks", "with_hooks")
        for mode in order:
            statistics.attach() if mode == "with_hooks" else statistics.detach()
            statistics.hook_seconds = 0.0
            elapsed = _timed(step)
            if round_ >= warmup:
                times[mode].append(elapsed)
                if mode == "with_hooks":
                    hook_share.append(statistics.hook_seconds / elapsed)
    statistics.detach()
    with_hooks, without = (stats_lib.median(times[m]) for m in ("with_hooks", "without_hooks"))
    return {"model": model_name, "density": density, "batch": batch, "steps": steps,
            "device": device.type, "step_s_with_hooks": with_hooks, "step_s_without_hooks": without,
            "overhead_percent": 100 * (with_hooks / without - 1),
            "hook_time_percent": 100 * stats_lib.median(hook_share)}
