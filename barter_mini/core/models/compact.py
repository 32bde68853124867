"""The two compact model families: CCT (Table 4, CIFAR-100) and ViT (Table 4, Tiny-ImageNet).

A compact model is an ordinary dense network whose layers simply have fewer heads and
FFN channels; its current per-layer counts are read off the timm modules themselves.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from timm.layers import PatchEmbed, trunc_normal_

from ..budgets import Allocation
from ..configs import ModelConfig
from ..surgery import allocation_of
from .blocks import CCTBlock, vit_block


class CompactTransformer(nn.Module):
    """Shared by both families: ``blocks`` of layers with ``.attn`` and ``.mlp``."""

    config: ModelConfig
    blocks: nn.ModuleList

    def allocation(self) -> Allocation:
        """The per-layer head and FFN-channel counts the tensors hold right now."""
        return allocation_of(self)

    def _layers(self, make_layer, allocation: Allocation, drop_path: float) -> nn.ModuleList:
        """One layer per allocation entry, stochastic depth rising linearly to ``drop_path``."""
        rates = torch.linspace(0, drop_path, self.config.depth).tolist()
        return nn.ModuleList(make_layer(self.config.embed_dim, h, c, self.config.head_dim, rate)
                             for h, c, rate in zip(allocation.heads, allocation.ffn, rates))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


class CompactCCT(CompactTransformer):
    """Compact Convolutional Transformer.

    Tokenizer: ``conv_layers`` x (conv k x k, stride 1, no bias -> ReLU -> MaxPool(3, 2, 1)),
    computed as conv -> MaxPool -> ReLU: the same function and gradients, because ReLU is
    monotone (``max(relu(a), relu(b)) = relu(max(a, b))``; where a window's maximum is <= 0
    both orders pass no gradient), and the ReLU then runs on a quarter of the pixels. That
    conv output is the widest tensor of the model (256 channels at 32 x 32 in ``cct-paper``),
    so the saving is part of the fixed cost that does not shrink with the density;
    a learnable positional embedding (no class token); the reference CCT layers; a final
    LayerNorm; sequence pooling ``softmax(Linear(D, 1))`` over tokens; a linear classifier.
    """

    #: rebuild the tokenizer's activations in backward from the images instead of keeping them
    #: (``--recompute``): its conv output, pool indices and ReLU output are the model's widest
    #: tensors, and one conv forward, cheap beside the layers, rebuilds them
    recompute_stem: bool = False

    def __init__(self, config: ModelConfig, allocation: Allocation, drop_path: float = 0.0):
        super().__init__()
        self.config = config
        dim, k = config.embed_dim, config.conv_kernel
        layers: list[nn.Module] = []
        chans = config.in_chans
        for i in range(config.conv_layers):
            out = dim if i == config.conv_layers - 1 else (config.conv_channels or dim)
            # the conv stays at index 3 i, so checkpoints of the ReLU-first order still load
            layers += [nn.Conv2d(chans, out, k, stride=1, padding=k // 2, bias=False),
                       nn.MaxPool2d(3, stride=2, padding=1), nn.ReLU()]
            chans = out
        self.tokenizer = nn.Sequential(*layers)
        self.pos_embed = nn.Parameter(torch.zeros(1, config.num_tokens, dim))
        self.blocks = self._layers(CCTBlock, allocation, drop_path)
        self.norm = nn.LayerNorm(dim)
        self.attention_pool = nn.Linear(dim, 1)
        self.head = nn.Linear(dim, config.num_classes)
        trunc_normal_(self.pos_embed, std=0.2)
        self.apply(self._init_weights)
        for m in self.tokenizer:
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Channels-last images make the tokenizer's (B, C, H, W) output (B, H, W, C) in
        # memory, so the tokens (B, HW, C) come out contiguous with no transposing copy, and
        # the residual stream stays contiguous through every block. Same function; on two
        # CPU cores a BARTER step of cct-paper at rho = 0.1 is about 15 % faster, because
        # these width-D copies do not shrink with the density (see barter_mini.measure.bench).
        x = x.contiguous(memory_format=torch.channels_last)
        if self.recompute_stem and torch.is_grad_enabled():
            # deterministic (no dropout in the stem): no RNG state to stash
            x = checkpoint(self.tokenizer, x, use_reentrant=False, preserve_rng_state=False)
        else:
            x = self.tokenizer(x)
        x = x.flatten(2).transpose(1, 2) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        weights = self.attention_pool(x).softmax(dim=1)      # (B, N, 1)
        x = (weights.transpose(1, 2) @ x).squeeze(1)          # (B, D)
        return self.head(x)


class CompactViT(CompactTransformer):
    """ViT for small datasets: timm ``PatchEmbed``, class token, timm ``Block`` layers."""

    def __init__(self, config: ModelConfig, allocation: Allocation, drop_path: float = 0.0):
        super().__init__()
        self.config = config
        dim = config.embed_dim
        self.patch_embed = PatchEmbed(config.img_size, config.patch_size, config.in_chans, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, config.num_tokens, dim))
        self.blocks = self._layers(vit_block, allocation, drop_path)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, config.num_classes)
        trunc_normal_(self.pos_embed, std=0.02)
        trunc_normal_(self.cls_token, std=0.02)
        self.apply(self._init_weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])
