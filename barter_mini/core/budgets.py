"""Global capacity budgets and their initial allocation (paper Table 3).

Heads and FFN channels have *separate* fixed global budgets. BARTER moves units between
layers but never changes either total.

Budget rule
-----------
Heads: ``H = round(rho * L * h)`` (L layers, h heads per full layer). This gives every
head count of Table 3 but ViT at rho = 0.3 (32.4 rounds to 32; the paper has 33, which no
rounding of ``rho * L * h`` reproduces together with CCT's 78 from 78.4).

FFN channels: Table 3's channel budgets are close to but not exactly ``rho * L * F``;
the paper does not state its rule. We use a *compute-matched* rule: the compact encoder
costs rho times the dense encoder's FLOPs, and the FFN budget absorbs the rounding of the
head budget::

    C = round((rho * (L*h*f_head + L*F*f_chan) - H * f_head) / f_chan)

with ``f_head = 4*D*d + 2*N*d`` and ``f_chan = 2*D`` the multiply-adds per token of one head
(q, k, v and output projections plus the attention scores and weighted sum over N tokens,
head dim d) and of one FFN channel (fc1 row and fc2 column), D the embedding dimension.

==========  ====  ===============  ===============  ============
model        rho   Table 3 (H, C)   this rule         rho * L * F
==========  ====  ===============  ===============  ============
cct-paper    0.1   11, 371          11, 368           358
cct-paper    0.3   34, 1,067        34, 1,056         1,075
cct-paper    0.5   56, 1,795        56, 1,792         1,792
cct-paper    0.7   78, 2,524        78, 2,528         2,509
vit-paper    0.1   11, 359          11, 338           346
vit-paper    0.3   33, 1,033        32, 1,052         1,037
==========  ====  ===============  ===============  ============

The compact CCT of this rule is within 0.5 % of Table 15's GFLOPs and parameter counts
(0.750 / 0.4802 M at rho = 0.1, 3.569 / 1.9480 M at rho = 0.5); ``paper_table3`` keeps the
paper's own numbers for the side-by-side view (``barter-mini describe``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .configs import ModelConfig
from ..errors import BarterError, check_in_range, choose

#: Table 3 of the paper: (heads, FFN channels, K_H, K_C) per model and density.
PAPER_TABLE3: dict[tuple[str, float], tuple[int, int, int, int]] = {
    ("cct-paper", 0.1): (11, 371, 1, 21),
    ("cct-paper", 0.3): (34, 1067, 2, 60),
    ("cct-paper", 0.5): (56, 1795, 3, 101),
    ("cct-paper", 0.7): (78, 2524, 5, 142),
    ("vit-paper", 0.1): (11, 359, 1, 20),
    ("vit-paper", 0.3): (33, 1033, 2, 58),
}


@dataclass(frozen=True)
class Budget:
    """Global unit counts of a compact model: heads and FFN channels over all layers."""

    heads: int
    ffn: int


@dataclass(frozen=True)
class Allocation:
    """Per-layer unit counts; ``sum(heads) == budget.heads`` at all times."""

    heads: tuple[int, ...]
    ffn: tuple[int, ...]

    def as_dict(self) -> dict[str, list[int]]:
        return {"heads": list(self.heads), "ffn": list(self.ffn)}


def unit_macs_per_token(config: ModelConfig) -> tuple[int, int]:
    """Forward multiply-adds per token of one head and of one FFN channel."""
    d, dim, n = config.head_dim, config.embed_dim, config.num_tokens
    return 4 * dim * d + 2 * n * d, 2 * dim


def check_density(density: float) -> float:
    return check_in_range("density", density, 0.0, 1.0, low_open=True)


def compute_budget(config: ModelConfig, density: float) -> Budget:
    """Head and FFN budgets for density rho (module docstring: the rule and Table 3)."""
    density = check_density(density)
    layers = config.depth
    full_heads, full_ffn = layers * config.heads_per_layer, layers * config.ffn_per_layer
    heads = round(density * full_heads)
    f_head, f_chan = unit_macs_per_token(config)
    ffn = round((density * (full_heads * f_head + full_ffn * f_chan) - heads * f_head) / f_chan)
    ffn = min(ffn, full_ffn)
    if heads < layers:
        lowest = layers / full_heads
        raise BarterError(
            f"density {density:g} gives {heads} heads for the {layers} layers of {config.name}; "
            f"every layer needs at least one head: use density >= {lowest:.4g}")
    if ffn < layers:
        raise BarterError(
            f"density {density:g} gives {ffn} FFN channels for the {layers} layers of "
            f"{config.name}; every layer needs at least one channel: use a larger density")
    return Budget(heads=heads, ffn=ffn)


def spread_evenly(total: int, layers: int) -> tuple[int, ...]:
    """``total`` units over ``layers`` layers, the first ``total % layers`` getting one more."""
    base, extra = divmod(total, layers)
    return tuple(base + (1 if i < extra else 0) for i in range(layers))


def initial_allocation(config: ModelConfig, budget: Budget) -> Allocation:
    return Allocation(heads=spread_evenly(budget.heads, config.depth),
                      ffn=spread_evenly(budget.ffn, config.depth))


#: where a run's compact model starts: spread evenly (the paper's start) or piled into the
#: first or the last layers (deliberately uneven starts, to watch reallocation undo them)
STARTS = ("even", "first", "last")


def spread_by_weights(total: int, weights: list[float], full_width: int) -> tuple[int, ...]:
    """``total`` units over layers in proportion to ``weights``, each layer holding 1 to
    ``full_width`` units: one unit at a time to the layer furthest below its share
    ``total * w_l / sum(w)`` (ties to the first), which is the largest-remainder rule with bounds."""
    layers = len(weights)
    if not layers <= total <= layers * full_width:
        raise BarterError(f"{total} units do not fit {layers} layers of 1..{full_width} units each")
    shares = [total * w / sum(weights) for w in weights]
    counts = [1] * layers
    for _ in range(total - layers):
        open_layers = [l for l in range(layers) if counts[l] < full_width]
        counts[max(open_layers, key=lambda l: (shares[l] - counts[l], -l))] += 1
    return tuple(counts)


def starting_allocation(config: ModelConfig, budget: Budget, start: str = "even") -> Allocation:
    """The allocation a compact run starts from: ``even`` (:func:`initial_allocation`), or
    piled with weights halving layer by layer away from the ``first`` or the ``last`` layer
    (``w_l = 2^-l`` or ``2^-(L-1-l)``): a start that puts most capacity where it may matter least."""
    choose("start", start, STARTS)
    if start == "even":
        return initial_allocation(config, budget)
    depth = config.depth
    weights = [2.0 ** -(l if start == "first" else depth - 1 - l) for l in range(depth)]
    return Allocation(heads=spread_by_weights(budget.heads, weights, config.heads_per_layer),
                      ffn=spread_by_weights(budget.ffn, weights, config.ffn_per_layer))


def full_allocation(config: ModelConfig) -> Allocation:
    return Allocation(heads=(config.heads_per_layer,) * config.depth,
                      ffn=(config.ffn_per_layer,) * config.depth)


def check_allocation(config: ModelConfig, allocation: Allocation) -> Allocation:
    """Refuse an allocation a model of ``config`` cannot hold."""
    for kind, counts, full in (("heads", allocation.heads, config.heads_per_layer),
                               ("ffn", allocation.ffn, config.ffn_per_layer)):
        if len(counts) != config.depth or not all(1 <= c <= full for c in counts):
            raise BarterError(
                f"{kind} allocation {list(counts)} is invalid for {config.name}: "
                f"{config.depth} layers of 1..{full} units each are allowed")
    return allocation
