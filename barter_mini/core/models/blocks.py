"""Transformer layers of a compact model, built from timm's own modules.

Every layer owns a ``timm.layers.Attention`` (``.attn``) whose heads have a fixed
dimension, and a ``timm.layers.Mlp`` (``.mlp``) whose hidden width is the layer's FFN
channel count. BARTER's surgery (:mod:`barter_mini.core.surgery`) resizes exactly these two
modules, so it works the same for both model families.
"""

from __future__ import annotations

from functools import lru_cache, partial

import torch
from torch import nn
from timm.layers import Attention, DropPath, Mlp
from timm.models.vision_transformer import Block


@lru_cache(maxsize=None)
def attention_with_head_dim(head_dim: int) -> type[Attention]:
    """timm's ``Attention`` with heads of ``head_dim`` channels, whatever the embedding width.

    timm's ``Block`` builds its attention from a *class* (it checks ``issubclass``), so the
    fixed head dimension is baked into a subclass rather than a ``functools.partial``.
    """

    class FixedHeadDimAttention(Attention):
        def __init__(self, dim: int, num_heads: int = 8, **kwargs):
            kwargs.pop("attn_head_dim", None)
            super().__init__(dim, num_heads=num_heads, attn_head_dim=head_dim, **kwargs)

    FixedHeadDimAttention.__name__ = f"Attention{head_dim}"
    FixedHeadDimAttention.__qualname__ = FixedHeadDimAttention.__name__
    return FixedHeadDimAttention


def _mlp_of_width(width: int, in_features: int, hidden_features=None, **kwargs) -> Mlp:
    # timm's Block derives the hidden width from a float mlp_ratio; a compact layer's width
    # is an exact integer, so it is fixed here instead of trusting int(dim * ratio).
    return Mlp(in_features, hidden_features=width, **kwargs)


def vit_block(dim: int, heads: int, channels: int, head_dim: int, drop_path: float = 0.0) -> Block:
    """timm's pre-norm ViT ``Block`` with ``heads`` heads and ``channels`` FFN channels."""
    return Block(dim, num_heads=heads, qkv_bias=False, drop_path=drop_path,
                 attn_layer=attention_with_head_dim(head_dim),
                 mlp_layer=partial(_mlp_of_width, channels))


class CCTBlock(nn.Module):
    """The reference CCT encoder layer (SHI-Labs Compact-Transformers), on timm modules.

    ``x = x + attn(pre_norm(x)); x = norm1(x); x = x + mlp(x)``: the second residual
    branch starts from the *normalised* stream, as in the reference implementation.
    """

    def __init__(self, dim: int, heads: int, channels: int, head_dim: int, drop_path: float = 0.0):
        super().__init__()
        self.pre_norm = nn.LayerNorm(dim)
        self.attn = attention_with_head_dim(head_dim)(dim, num_heads=heads, qkv_bias=False)
        self.norm1 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, hidden_features=channels, act_layer=nn.GELU)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.pre_norm(x)))
        x = self.norm1(x)
        return x + self.drop_path(self.mlp(x))
