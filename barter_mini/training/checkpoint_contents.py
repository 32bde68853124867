"""What a checkpoint holds, checked entry by entry before anything is built from it.

A file read with the restricted unpickler (:mod:`~barter_mini.training.checkpoints`) holds
only plain types, but of any value: a string where a count belongs, ``total_steps = -5``,
``depth = 2**20``, a generator state out of range. Each is refused here in one line that
names the file, the entry, what it must be and what it is: the settings of the model
(:func:`check_model_entries`), its weights against the model built on the meta device
(:func:`model_shapes`, :func:`check_weights`: names, shapes, dtypes and bytes; the real model
is built only for weights that fill it exactly, so no setting makes a load allocate more
than the file holds). Every other entry is its part's to check
(:data:`~barter_mini.training.checkpoint_parts.PARTS`), with the same one-line checks
(:func:`check_entry` and the predicates here).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import re
from pathlib import Path
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from ..core.budgets import Allocation, check_allocation
from ..core.configs import ModelConfig
from ..core.models import FAMILIES, build_model
# the one rule of which timm options load weights: a checkpoint's settings, like a model name,
# rebuild an architecture and may not name what to load
from ..core.models.timm_vit import TIMM_LOADING_OPTIONS, loads_weights
from ..errors import BarterError

#: what building a model from a file's settings can end in (a size of 0, a patch larger than
#: the image, a family or timm option this version lacks)
BUILD_ERRORS = (KeyError, TypeError, ValueError, AttributeError, RuntimeError, IndexError, ArithmeticError,
                AssertionError)

# ----------------------------------------------------------------------------- entries of their kind

def is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def integer(low: int) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low


def finite_number(low: float = -math.inf, high: float = math.inf) -> Callable[[Any], bool]:
    return lambda value: is_real(value) and math.isfinite(value) and low <= value <= high


def optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(check(item) for item in value)


def is_record(value) -> bool:
    """A history or curve entry: names and numbers (NaN allowed: JSON writes it as null)."""
    return isinstance(value, dict) and all(isinstance(k, str) and is_real(v) for k, v in value.items())


def are_scores(value) -> bool:
    return isinstance(value, dict) and {"acc", "macro_f1"} <= set(value) and all(
        finite_number(0.0, 1.0)(value[k]) for k in ("acc", "macro_f1"))


def is_dict(value) -> bool:
    return isinstance(value, dict)


def shown(value) -> str:
    """``value`` in a few words: a tensor by its dtype and shape, a long container by its length."""
    if torch.is_tensor(value):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    shown = repr(value)
    if len(shown) <= 60:
        return shown
    return f"a {type(value).__name__} of {len(value)} entries" if isinstance(value, (dict, list, tuple)) else \
        shown[:57] + "..."


def check_entry(path: Path, name: str, value, check: Callable[[Any], bool], allowed: str) -> None:
    if not check(value):
        raise BarterError(f"{path}: {name} must be {allowed}, got {shown(value)}: the file is damaged or not "
                          "barter-mini's; retrain the run (into a new --out)")


#: the :class:`~barter_mini.core.configs.ModelConfig` fields that count something, and the
#: least each may be; ``conv_channels`` may also be None
CONFIG_COUNTS = {"img_size": 1, "in_chans": 1, "num_classes": 1, "depth": 1, "embed_dim": 1, "heads_per_layer": 1,
                 "ffn_per_layer": 1, "head_dim": 1, "conv_layers": 0, "conv_kernel": 1, "conv_channels": 1,
                 "patch_size": 1, "prefix_tokens": 0}
#: ... the fields that name something (``timm_model`` may also be None), and the pairs of ``timm_kwargs``
CONFIG_NAMES = ("name", "family", "default_dataset", "timm_model")
#: ... the counts of layers (encoder layers, tokenizer convolutions): each holds a tensor, so
#: there are at most as many as the file holds tensors
LAYER_COUNTS = ("depth", "conv_layers")
#: the layer a weight belongs to: ``blocks.N.`` in every family (the package's and timm's)
LAYER_KEY = re.compile(r"blocks\.(\d+)\.")


def _plain(value) -> bool:
    """A timm option's value: a number, string, bool, None or a tuple or list of them."""
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    return value is None or isinstance(value, (bool, str)) or finite_number()(value)


def check_model_entries(checkpoint: dict, path: Path) -> tuple[ModelConfig, Allocation]:
    """The model configuration and per-layer allocation of ``checkpoint`` (:data:`~barter_mini.training.checkpoints.MODEL_KEYS`),
    or a one-line error naming ``path``: every setting of its type and range, the allocation
    within the configuration's bounds (:func:`~barter_mini.core.budgets.check_allocation`),
    the weights a dict of named tensors whose layers (``blocks.N.``) are exactly the
    configuration's ``depth``. The counts of layers (:data:`LAYER_COUNTS`) are at most the
    file's tensors, so building a model from the file takes time in proportion to the file
    (its sizes cost nothing on the meta device, :func:`model_shapes`)."""
    weights = checkpoint["model"]
    check_entry(path, "model", weights, lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and torch.is_tensor(t) for k, t in v.items()), "a dict of named tensors")
    saved = checkpoint["model_config"]
    check_entry(path, "model_config", saved, is_dict, "a dict of the model's settings")
    known = set(CONFIG_COUNTS) | set(CONFIG_NAMES) | {"timm_kwargs"}
    unknown = sorted(map(repr, set(saved) - known))      # repr: a name may hold a line break
    if unknown:
        raise BarterError(f"{path}: model_config holds {', '.join(unknown[:3])}{' ...' if len(unknown) > 3 else ''}, "
                          "which this version's models do not have: retrain the run with this version")
    for name, low in CONFIG_COUNTS.items():
        if name in saved:
            check = optional(integer(low)) if name == "conv_channels" else integer(low)
            check_entry(path, f"model_config.{name}", saved[name], check, f"an integer >= {low}")
    for name in LAYER_COUNTS:           # each such layer holds a tensor of the file's
        if name in saved:
            check_entry(path, f"model_config.{name}", saved[name], lambda v: v <= len(weights),
                         f"at most the {len(weights)} tensors the file holds")
    for name in CONFIG_NAMES:
        if name in saved:
            check = (lambda v: v is None or isinstance(v, str)) if name == "timm_model" else \
                (lambda v: isinstance(v, str))
            check_entry(path, f"model_config.{name}", saved[name], check, "a string")
    check_entry(path, "model_config.family", saved.get("family"), lambda v: v in FAMILIES,
                 f"one of {', '.join(FAMILIES)}")
    pairs = saved.get("timm_kwargs", ())
    check_entry(path, "model_config.timm_kwargs", pairs, lambda v: isinstance(v, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) and not loads_weights(p[0])
        and _plain(p[1]) for p in v), "(name, value) pairs of timm.create_model options that name no file or "
                                      "download (" + ", ".join(TIMM_LOADING_OPTIONS) + ")")
    try:
        config = ModelConfig.from_dict(saved)
    except TypeError as error:          # a field it lacks
        raise BarterError(f"{path}: model_config cannot be read ({error}): retrain the run with this version") from None

    allocation = checkpoint["allocation"]
    check_entry(path, "allocation", allocation, lambda v: isinstance(v, dict) and set(v) == {"heads", "ffn"} and all(
        isinstance(w, (list, tuple)) and len(w) == config.depth and all(map(integer(0), w)) for w in v.values()),
        f"a dict of heads and ffn, each a list of {config.depth} integers (model_config's depth)")
    allocation = Allocation(heads=tuple(allocation["heads"]), ffn=tuple(allocation["ffn"]))
    try:
        check_allocation(config, allocation)
    except BarterError as error:
        raise BarterError(f"{path}: {error}") from None

    layers = {int(match.group(1)) for match in map(LAYER_KEY.match, weights) if match}
    if layers != set(range(config.depth)):
        raise BarterError(f"{path}: model_config has {config.depth} layers, and the weights name layers "
                          f"{_ranges(sorted(layers))}: the file is damaged or not barter-mini's; retrain the run")
    return config, allocation


def _ranges(values: list[int]) -> str:
    return "none" if not values else f"{values[0]}..{values[-1]} ({len(values)} of them)"


class _OnMeta(TorchFunctionMode):
    """Tensors made without a device (a layer's weights) go to the meta device: they have a
    shape and no storage, whatever their size. Only the factories are redirected, so the
    models' own arithmetic on small real tensors (drop-path rates' ``linspace(...).tolist()``)
    keeps working. More than ``limit`` tensors made is ``_TooManyTensors``: every model
    makes about one per tensor of its state dict, so a file's settings that describe a model
    of far more tensors than the file holds are stopped early."""

    FACTORIES = frozenset({torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn})

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.made = limit, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self.FACTORIES and kwargs.get("device") is None:
            kwargs["device"] = "meta"
            self.made += 1
            if self.made > self.limit:
                raise _TooManyTensors
        return func(*args, **kwargs)


class _TooManyTensors(Exception):
    pass


def model_shapes(config: ModelConfig, allocation: Allocation, path: Path, tensors: int) -> torch.nn.Module:
    """The model of ``config`` at ``allocation`` built on the meta device (``_OnMeta``): its
    parameters' names and shapes without memory, so a checkpoint's ``tensors`` tensors can be
    checked against it before the model is built for real; a one-line error if the settings
    build none, or one of far more tensors (over ``2 * tensors + 16`` made)."""
    try:
        with building_from(path), _OnMeta(limit=2 * tensors + 16):
            return build_model(config, allocation=allocation)
    except _TooManyTensors:
        raise BarterError(f"{path}: model_config describes a model of more than twice the {tensors} tensors the file "
                          "holds: the file is damaged or not barter-mini's; retrain the run") from None


@contextlib.contextmanager
def building_from(path: Path):
    """Building a model from the file ``path``'s settings or loading its weights: what that
    raises (a :class:`~barter_mini.errors.BarterError`, or one of :data:`BUILD_ERRORS`)
    becomes one line naming the file."""
    try:
        yield
    except BarterError as error:
        raise BarterError(f"{path}: {error}") from None
    except BUILD_ERRORS as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise BarterError(f"{path} does not describe a model this version can build ({type(error).__name__}"
                          f"{': ' + first[:160] if first else ''}): retrain the run with this version") from None


def check_weights(expected: dict, found: Any, path: Path, optional: tuple[str, ...] = ()) -> None:
    """Refuse, in one line naming ``path`` and the first tensor that differs (in the model's
    order), weights ``found`` that do not fit a model whose state dict is ``expected``: a
    tensor missing (unless its name starts with one of ``optional``, e.g. a classifier left
    to its fresh initialisation) or unknown to the model, a value that is no tensor, another
    shape, a dtype of another kind (any floating point for floating point: loading converts
    between precisions; otherwise the same dtype), or a tensor whose storage holds fewer
    bytes than its elements need (a stride of 0 that would make one stored number a large
    tensor once copied). PyTorch's own message for these is many lines."""
    if not isinstance(found, dict):
        raise BarterError(f"{path} holds {type(found).__name__} where a dict of named tensors belongs: "
                          "pass a checkpoint written by barter-mini or timm")
    for name, want in expected.items():
        if name not in found:
            if optional and name.startswith(optional):
                continue
            raise BarterError(f"{path} lacks the tensor {name} of the model: pass a checkpoint of the same model")
        have = found[name]
        if not torch.is_tensor(have):
            raise BarterError(f"{path}: {name} is a {type(have).__name__} in the file, a tensor in the model")
        if have.shape != want.shape:
            raise BarterError(f"{path} does not fit the model: {name} of shape {list(want.shape)} in the model, "
                              f"{list(have.shape)} in the file; pass a checkpoint of the same model and sizes")
        if have.dtype != want.dtype and not (have.is_floating_point() and want.is_floating_point()):
            raise BarterError(f"{path}: {name} is {have.dtype} in the file, {want.dtype} in the model: "
                              "pass a checkpoint of trained weights")
        if have.numel() * have.element_size() > have.untyped_storage().nbytes():
            raise BarterError(f"{path}: {name} has {have.numel():,} elements and stores "
                              f"{have.untyped_storage().nbytes():,} bytes: the file is damaged")
    unknown = [name for name in found if name not in expected]
    if unknown:
        raise BarterError(f"{path} holds {unknown[0]!r}{f' and {len(unknown) - 1} more' if len(unknown) > 1 else ''}, "
                          "which the model has no tensor for: pass a checkpoint of the same model")

