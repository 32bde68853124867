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

A model name comes from the command line, a sweep grid or a notebook parameter, so its size
is bounded before anything is built: the name's length and its number of options, each
number in an option, the depth (each layer is Python objects, built one by one), and the
model's parameters, counted on PyTorch's ``meta`` device, which allocates nothing. A model
name describes an architecture only: options of ``timm.create_model`` that load weights from
a file or the network (:data:`TIMM_LOADING_OPTIONS`, :func:`loads_weights`) are refused, on
the command line as in a checkpoint's settings (weights come in through ``--init``, whose
files are checked).
"""

from __future__ import annotations

import ast
from functools import lru_cache

import timm
import torch
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
    created with. ``kwargs`` that would load weights
    (:func:`~barter_mini.core.models.timm_vit.loads_weights`) are refused: a
    checkpoint of the model could not be read back.
    """
    loading = sorted(key for key in (kwargs or {}) if loads_weights(key))
    if loading:
        raise BarterError(f"timm options {', '.join(loading)} load weights: describe the architecture only "
                          "(load the weights into the model first)")
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
#: the longest ``timm:ARCH:key=value,...`` accepted (the longest useful one is a few hundred)
MAX_SPEC_CHARS = 1000
#: the most ``key=value`` options one name may carry
MAX_OPTIONS = 32
#: the largest magnitude of a number in an option (sizes, counts, ratios: a compact ViT's are
#: far smaller; timm sizes tensors and loops by them unchecked)
MAX_OPTION_NUMBER = 65_536
#: the deepest model accepted (timm's deepest ViTs have 48 layers)
MAX_DEPTH = 256
#: the most parameters and buffer elements a model may hold (2 billion: timm's largest ViT,
#: vit_gigantic, holds 1.8 billion; 8 GB in fp32 before any gradient or optimizer state)
MAX_PARAMETERS = 2_000_000_000
#: ``timm.create_model``'s own options that load weights from a file or the network, and what
#: they read or where they cache it; every option named ``pretrained...`` counts too
#: (:func:`loads_weights`)
TIMM_LOADING_OPTIONS = ("pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "pretrained_strict",
                        "checkpoint_path", "cache_dir")


def loads_weights(option: str) -> bool:
    """Whether the ``timm.create_model`` option ``option`` loads weights (or says from where):
    one of :data:`TIMM_LOADING_OPTIONS` or any ``pretrained...`` option. A model's options
    (on the command line, in a checkpoint's settings) rebuild an architecture only."""
    return option in TIMM_LOADING_OPTIONS or option.startswith("pretrained")


def _option_value(text: str):
    """An option's value: a Python literal, else the text itself."""
    try:
        return ast.literal_eval(text)
    # RecursionError, MemoryError: the parser's limits on nesting ("((((..."), reached by
    # the bounded text of one option, not by a lack of memory
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return text


def _numbers_in(value):
    """The numbers in an option's value, nested lists, tuples, sets and dicts included."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float, complex)):
        yield value
    elif isinstance(value, dict):
        for item in (*value.keys(), *value.values()):
            yield from _numbers_in(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _numbers_in(item)


def _parse_options(name: str, given: str) -> dict:
    """The keyword arguments of ``key=value,...``, each bounded (:data:`MAX_OPTIONS`,
    :data:`MAX_OPTION_NUMBER`, :data:`MAX_DEPTH`) and none loading weights (:func:`loads_weights`)
    before timm sees any of them."""
    items = [item for item in given.split(",") if item]
    if len(items) > MAX_OPTIONS:
        raise BarterError(f"timm:{name} has {len(items)} options: at most {MAX_OPTIONS} are accepted")
    kwargs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise BarterError(f"timm model option {item!r}: write key=value, e.g. timm:{name}:patch_size=4")
        if loads_weights(key):
            raise BarterError(f"timm model option {key}=...: a model name describes an architecture and may not load "
                              "weights from a file or the network (" + ", ".join(TIMM_LOADING_OPTIONS) + "); "
                              "give the weights' file as --init")
        kwargs[key] = _option_value(value)
        for number in _numbers_in(kwargs[key]):
            if not abs(number) <= MAX_OPTION_NUMBER:          # nan too
                raise BarterError(f"timm model option {key}={value}: numbers in an option must lie between "
                                  f"-{MAX_OPTION_NUMBER:,} and {MAX_OPTION_NUMBER:,}")
    depth = kwargs.get("depth")
    if isinstance(depth, int) and not isinstance(depth, bool) and depth > MAX_DEPTH:
        raise BarterError(f"timm model option depth={depth}: at most {MAX_DEPTH} layers are accepted")
    return kwargs


def _creation_failed(name: str, kwargs: dict, error: Exception) -> BarterError:
    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return BarterError(f"timm.create_model({name!r}, **{kwargs}) failed: {message}")


#: what timm raises for options it cannot build; ArithmeticError: it divides by options such
#: as patch_size=0 or num_heads=0 unchecked
CREATION_ERRORS = (TypeError, ValueError, AssertionError, RuntimeError, ArithmeticError)


def _create_checked(name: str, kwargs: dict) -> nn.Module:
    """``timm.create_model(name, **kwargs)``, untrained, once it is known to fit
    :data:`MAX_PARAMETERS`: it is built on the ``meta`` device first, which allocates no memory."""
    try:
        with torch.device("meta"):
            probe = timm.create_model(name, pretrained=False, **kwargs)
    except CREATION_ERRORS as error:
        raise _creation_failed(name, kwargs, error) from None
    size = sum(t.numel() for t in (*probe.parameters(), *probe.buffers()))
    if size > MAX_PARAMETERS:
        raise BarterError(f"timm.create_model({name!r}, **{kwargs}) would hold {size:,} parameters: at most "
                          f"{MAX_PARAMETERS:,} are accepted")
    try:
        return timm.create_model(name, pretrained=False, **kwargs)
    except CREATION_ERRORS as error:
        raise _creation_failed(name, kwargs, error) from None


def timm_model_config(spec: str) -> ModelConfig:
    """The configuration named ``timm:ARCH[:key=value,...]`` (values are Python literals,
    else strings), described from an untrained ``timm.create_model(ARCH, **kwargs)``. The
    name and the model are bounded (:data:`MAX_SPEC_CHARS` ... :data:`MAX_PARAMETERS`)."""
    if len(spec) > MAX_SPEC_CHARS:     # before the cache, which would keep it
        raise BarterError(f"the model name {spec[:40]}... is {len(spec):,} characters long: a timm:ARCH:key=value,... "
                          f"name is at most {MAX_SPEC_CHARS:,}")
    return _timm_model_config(spec)


@lru_cache(maxsize=32)
def _timm_model_config(spec: str) -> ModelConfig:
    name, _, given = spec.removeprefix(TIMM_PREFIX).partition(":")
    if not timm.is_model(name):
        raise BarterError(f"unknown timm model {name!r}: give timm:ARCH with ARCH from timm.list_models('vit_*') "
                          "or another ViT whose blocks hold timm Attention and Mlp")
    kwargs = _parse_options(name, given)
    return describe_timm_vit(_create_checked(name, kwargs), name, kwargs)


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
