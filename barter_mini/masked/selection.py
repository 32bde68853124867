"""Selection rules the masked baselines share: top-k per row with candidate tiers, and
integer apportioning (drop the smallest, grow the largest, redistribute exactly)."""

from __future__ import annotations

import math

import torch


def select_top(score: torch.Tensor, tier: torch.Tensor, count) -> torch.Tensor:
    """Per row of the 2-D ``score``: the ``count`` entries of highest ``(tier, score)``.

    ``tier`` orders candidates before ``score`` does (higher first); entries with a negative
    tier are never chosen. Ties go to the lower index. ``count`` is an int or one per row.
    """
    rows, cols = score.shape
    order = torch.sort(score, dim=1, descending=True, stable=True).indices
    order = order.gather(1, torch.sort(tier.gather(1, order), dim=1, descending=True, stable=True).indices)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(cols, device=score.device).expand(rows, cols))
    count = torch.as_tensor(count, device=score.device).reshape(-1, 1)
    return (ranks < count) & (tier >= 0)


def drop_smallest(magnitude: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` active entries of ``mask`` with the smallest ``magnitude`` (any shape)."""
    tier = torch.where(mask, 0, -1).reshape(1, -1)
    return select_top(-magnitude.reshape(1, -1), tier, n).reshape(mask.shape)


def growth_tiers(before: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Candidate order for growth: 1 inactive before the update, 0 just dropped, -1 kept."""
    return torch.where(kept, -1, torch.where(before, 0, 1))


def grow_largest(score: torch.Tensor, before: torch.Tensor, kept: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` new weights of largest ``score``, previously inactive ones first (any shape)."""
    tier = growth_tiers(before, kept).reshape(1, -1)
    return select_top(score.reshape(1, -1), tier, n).reshape(before.shape)


def apportion(total: int, weights: list[float], caps: list[int]) -> list[int]:
    """Split ``total`` into integers proportional to ``weights``, each at most its cap.

    Water-filling: a share above its cap is clipped and the rest is shared again among the
    others; then floors plus largest remainders, so the parts add up to
    ``min(total, sum(caps))`` exactly. All-zero weights share equally.
    """
    n = len(weights)
    total = min(int(total), int(sum(caps)))
    if total <= 0:
        return [0] * n
    weights = [max(0.0, float(w)) if math.isfinite(w) else 0.0 for w in weights]
    if sum(weights) <= 0:
        weights = [1.0] * n
    share = [0.0] * n
    free = [i for i in range(n) if caps[i] > 0]
    remaining = float(total)
    while free:
        mass = sum(weights[i] for i in free)
        if mass <= 0:
            raw = {i: remaining / len(free) for i in free}
        else:
            raw = {i: remaining * weights[i] / mass for i in free}
        over = [i for i in free if raw[i] > caps[i]]
        if not over:
            for i in free:
                share[i] = raw[i]
            break
        for i in over:
            share[i] = float(caps[i])
            remaining -= caps[i]
            free.remove(i)
    parts = [min(caps[i], math.floor(share[i] + 1e-9)) for i in range(n)]
    leftover = total - sum(parts)
    order = sorted(range(n), key=lambda i: (-(share[i] - parts[i]), i))
    while leftover > 0:
        for i in order:
            if leftover > 0 and parts[i] < caps[i]:
                parts[i] += 1
                leftover -= 1
    return parts
