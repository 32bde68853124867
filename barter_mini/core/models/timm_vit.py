"""Stock timm vision transformers as compact models.

BARTER's surgery touches only a layer's ``attn`` (timm ``Attention``: ``qkv``, ``proj``,
``num_heads``, ``head_dim``) and ``mlp`` (timm ``Mlp``: ``fc1``, ``fc2``), so any timm model
whose ``blocks`` hold those two modules (``vit_*``, ``deit_*``, ...) can be trained
compact: its tensors are resized in place, the rest of the model (patch embedding, class
and register tokens, LayerScale, norms, head) is left as timm built it.

A model is described by a :class:`~barter_mini.core.configs.ModelConfig` with ``timm_model``
set: the architecture name and the keyword arguments that rebuild it, so checkpoints,
export and the bench rebuild it with ``timm.create_model`` like the package's own models.
On the command line a model name ``timm:ARCH`` or ``timm:ARCH:key=value,...`` (e.g.
``timm:vit_tiny_patch16_224:patch_size=4``) names one (:func:`timm_model_config`); the
image size, channels and classes follow the dataset, as for every model.
Layer variants the surgery cannot resize are refused: attention with ``scale_norm`` (a
LayerNorm over all heads) or a gate, and gated or normalised MLPs (``GluMlp``, ``SwiGLU``,
``Mlp`` with a hidden ``norm``).
"""

from __future__ import annotations

import ast
from functools import lru_cache

import timm
from timm.layers import Attention, Mlp
from torch import nn

from ...errors import BarterError
from ..budgets import Allocation
from ..configs import ModelConfig
from ..surgery import resize_layers, unit_count


def check_resizable(model: nn.Module) -> None:
    """Refuse a model whose layers BARTER's surgery cannot resize (one-line error)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None or len(blocks) == 0:
        raise BarterError(f"{type(model).__name__} has no .blocks: BARTER needs layers with a timm "
                          "Attention (.attn) and Mlp (.mlp), as in timm's VisionTransformer")
    for layer, block in enumerate(blocks):
        attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
        if not isinstance(attn, Attention) or not isinstance(mlp, Mlp):
            raise BarterError(f"layer {layer} ({type(block).__name__}) does not hold a timm Attention .attn and "
                              f"Mlp .mlp (found {type(attn).__name__}, {type(mlp).__name__}): it cannot be resized")
        if not isinstance(attn.norm, nn.Identity) or getattr(attn, "gate", None) is not None:
            raise BarterError(f"layer {layer}'s attention has scale_norm or a gate over all heads: "
                              "only plain timm Attention (qk_norm allowed) can be resized")
        if not isinstance(mlp.norm, nn.Identity):
            raise BarterError(f"layer {layer}'s Mlp normalises its hidden channels: only timm Mlp "
                              "without a hidden norm can be resized")


def describe_timm_vit(model: nn.Module, name: str | None = None, kwargs: dict | None = None) -> ModelConfig:
    """The full-width :class:`~barter_mini.core.configs.ModelConfig` of a stock timm vision transformer.

    ``name`` defaults to ``model.pretrained_cfg["architecture"]``; ``kwargs`` to the
    sizes read off the model (image and patch size, channels, classes, width, depth, heads,
    MLP width, qkv bias). The description is checked by rebuilding the model from it: if
    the rebuilt state dict differs in any key or shape, pass the ``kwargs`` the model was
    created with.
    """
    check_resizable(model)
    name = name or getattr(model, "pretrained_cfg", {}).get("architecture")
    if not name:
        raise BarterError("the timm model's architecture is unknown: pass its timm name")
    first = model.blocks[0]
    embed = model.patch_embed
    counts = [(unit_count(b, "heads"), unit_count(b, "ffn")) for b in model.blocks]
    if len(set(counts)) != 1:
        raise BarterError(f"the layers of the dense model differ in width ({sorted(set(counts))}): "
                          "start from a model whose layers are all full")
    heads, ffn = counts[0]
    sizes = {"img_size": embed.img_size[0], "patch_size": embed.patch_size[0], "in_chans": embed.proj.in_channels,
             "num_classes": model.num_classes, "embed_dim": model.embed_dim, "depth": len(model.blocks),
             "num_heads": heads, "mlp_ratio": ffn / model.embed_dim, "qkv_bias": first.attn.qkv.bias is not None}
    kwargs = {**sizes, **(kwargs or {})}
    config = ModelConfig(
        name=name, family="vit", img_size=sizes["img_size"], in_chans=sizes["in_chans"],
        num_classes=sizes["num_classes"], depth=sizes["depth"], embed_dim=model.embed_dim,
        heads_per_layer=heads, ffn_per_layer=ffn, head_dim=first.attn.head_dim,
        patch_size=sizes["patch_size"], prefix_tokens=getattr(model, "num_prefix_tokens", 1),
        timm_model=name, timm_kwargs=tuple(sorted(kwargs.items())))
    rebuilt = create_timm_vit(config).state_dict()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if shapes != {k: tuple(v.shape) for k, v in rebuilt.items()}:
        raise BarterError(f"timm.create_model({name!r}, **{kwargs}) does not rebuild this model: "
                          "pass the keyword arguments it was created with")
    return config


#: the prefix of a model name that names a stock timm architecture
TIMM_PREFIX = "timm:"


@lru_cache(maxsize=32)
def timm_model_config(spec: str) -> ModelConfig:
    """The configuration named ``timm:ARCH[:key=value,...]`` (values are Python literals,
    else strings), described from an untrained ``timm.create_model(ARCH, **kwargs)``."""
    name, _, given = spec.removeprefix(TIMM_PREFIX).partition(":")
    if not timm.is_model(name):
        raise BarterError(f"unknown timm model {name!r}: give timm:ARCH with ARCH from timm.list_models('vit_*') "
                          "or another ViT whose blocks hold timm Attention and Mlp")
    kwargs = {}
    for item in filter(None, given.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise BarterError(f"timm model option {item!r}: write key=value, e.g. timm:{name}:patch_size=4")
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    try:
        model = timm.create_model(name, pretrained=False, **kwargs)
    # ArithmeticError: timm divides by options such as patch_size=0 or num_heads=0 unchecked
    except (TypeError, ValueError, AssertionError, RuntimeError, ArithmeticError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise BarterError(f"timm.create_model({name!r}, **{kwargs}) failed: {message}") from None
    return describe_timm_vit(model, name, kwargs)


def create_timm_vit(config: ModelConfig, drop_path: float = 0.0) -> nn.Module:
    """``timm.create_model`` of ``config`` at full width, untrained (``pretrained=False``)."""
    kwargs = dict(config.timm_kwargs)
    if drop_path:
        kwargs["drop_path_rate"] = drop_path
    model = timm.create_model(config.timm_model, pretrained=False, **kwargs)
    check_resizable(model)
    return model


def build_timm_vit(config: ModelConfig, allocation: Allocation, drop_path: float = 0.0) -> nn.Module:
    """The stock timm model of ``config`` at ``allocation`` (its first units), with
    ``model.config`` set: what the trainer, the statistics and export read."""
    model = resize_layers(create_timm_vit(config, drop_path), allocation)
    model.config = config
    return model
