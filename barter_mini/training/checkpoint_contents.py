"""What a checkpoint holds, checked entry by entry before anything is built from it.

A file read with the restricted unpickler (:mod:`~barter_mini.training.checkpoints`) holds
only plain types, but of any value: a string where a count belongs, ``total_steps = -5``,
``depth = 2**20``, a generator state out of range. Each is refused here in one line that
names the file, the entry, what it must be and what it is: the settings of the model
(:func:`check_model_entries`), its weights against the model built on the meta device
(:func:`model_shapes`, :func:`check_weights`: names, shapes, dtypes and bytes; the real model
is built only for weights that fill it exactly, so no setting makes a load allocate more
than the file holds), and the trainer's state of a ``last.pt`` (:func:`check_resume_state`).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import random
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from timm.scheduler import CosineLRScheduler
from torch.overrides import TorchFunctionMode

from ..core.budgets import Allocation, check_allocation
from ..core.configs import ModelConfig
from ..core.models import FAMILIES, build_model
from ..errors import BarterError

#: what building a model from a file's settings can end in (a size of 0, a patch larger than
#: the image, a family or timm option this version lacks)
BUILD_ERRORS = (KeyError, TypeError, ValueError, AttributeError, RuntimeError, IndexError, ArithmeticError,
                AssertionError)

# ----------------------------------------------------------------------------- entries of their kind

def _real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _integer(low: int) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low


def _number(low: float = -math.inf, high: float = math.inf) -> Callable[[Any], bool]:
    return lambda value: _real(value) and math.isfinite(value) and low <= value <= high


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(check(item) for item in value)


def _record(value) -> bool:
    """A history or curve entry: names and numbers (NaN allowed: JSON writes it as null)."""
    return isinstance(value, dict) and all(isinstance(k, str) and _real(v) for k, v in value.items())


def _scores(value) -> bool:
    return isinstance(value, dict) and {"acc", "macro_f1"} <= set(value) and all(
        _number(0.0, 1.0)(value[k]) for k in ("acc", "macro_f1"))


def _is_dict(value) -> bool:
    return isinstance(value, dict)


def _shown(value) -> str:
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
        raise BarterError(f"{path}: {name} must be {allowed}, got {_shown(value)}: the file is damaged or not "
                          "barter-mini's; retrain the run (into a new --out)")


#: what a checkpoint's entries hold (checked by :func:`~barter_mini.training.checkpoints.check_checkpoint` where they are needed)
ENTRY_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "run": (_is_dict, "a dict of the run's settings"),
    "recipe": (_is_dict, "a dict of the recipe's settings"),
    "controller": (_is_dict, "a dict (the method's state)"),
    "optimizer": (_is_dict, "a dict (the optimizer's state)"),
    "resume": (_is_dict, "a dict (the trainer's state)"),
    "epoch": (_integer(0), "an integer >= 0"),
    "step": (_integer(0), "an integer >= 0"),
    "val": (_optional(_scores), "None or the validation scores {acc, macro_f1} in [0, 1]"),
}

#: every entry of ``last.pt``'s ``resume`` (the trainer's ``resume_state``) and what it must
#: be for the trainer to continue from it (:func:`check_resume_state`)
RESUME_STATE_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "train_gflops": (_number(0.0), "a finite number >= 0"),
    "update_seconds": (_number(0.0), "a finite number >= 0"),
    "step": (_integer(0), "an integer >= 0"),
    "skipped_steps": (_integer(0), "an integer >= 0"),
    "best_acc": (_number(-1.0, 1.0), "a number in [-1, 1]"),
    "history": (_list_of(_record), "a list of dicts of numbers"),
    "curve": (_list_of(_record), "a list of dicts of numbers"),
    "window": (_list_of(lambda pair: isinstance(pair, (list, tuple)) and len(pair) == 2 and all(map(_real, pair))),
               "a list of (loss, accuracy) pairs"),
    "step_losses": (_list_of(_real), "a list of numbers"),
    "epoch": (_integer(1), "an integer >= 1"),
    "batches_done": (_integer(0), "an integer >= 0"),
    "epoch_losses": (_list_of(_real), "a list of numbers"),
    "epoch_loader_state": (_optional(lambda state: _generator_state_error(state) is None),
                           "None or the state of a torch generator"),
    "last_val": (_optional(_scores), "None or the validation scores {acc, macro_f1} in [0, 1]"),
    "total_steps": (_integer(1), "an integer >= 1"),
    "epochs": (_integer(1), "an integer >= 1"),
    "scheduler": (_is_dict, "a dict (timm's scheduler state)"),
    "rng": (lambda states: isinstance(states, list) and len(states) > 0 and all(
        isinstance(state, dict) and {"python", "numpy", "torch", "cuda"} <= set(state) for state in states),
            "a list of every process's generator states (dicts of python, numpy, torch, cuda)"),
    "scaler": (_optional(_is_dict), "None or a dict (the fp16 loss scaler's state)"),
    "elapsed_s": (_number(0.0), "a finite number >= 0"),
}

#: the :class:`~barter_mini.core.configs.ModelConfig` fields that count something, and the
#: least each may be; ``conv_channels`` may also be None
CONFIG_COUNTS = {"img_size": 1, "in_chans": 1, "num_classes": 1, "depth": 1, "embed_dim": 1, "heads_per_layer": 1,
                 "ffn_per_layer": 1, "head_dim": 1, "conv_layers": 0, "conv_kernel": 1, "conv_channels": 1,
                 "patch_size": 1, "prefix_tokens": 0}
#: ... the fields that name something (``timm_model`` may also be None), and the pairs of ``timm_kwargs``
CONFIG_NAMES = ("name", "family", "default_dataset", "timm_model")
#: ``timm.create_model``'s own options that load weights from a file or the network: a
#: checkpoint's settings rebuild an architecture and may not name what to load
TIMM_LOADING_OPTIONS = ("pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path", "cache_dir")
#: ... the counts of layers (encoder layers, tokenizer convolutions): each holds a tensor, so
#: there are at most as many as the file holds tensors
LAYER_COUNTS = ("depth", "conv_layers")
#: the layer a weight belongs to: ``blocks.N.`` in every family (the package's and timm's)
LAYER_KEY = re.compile(r"blocks\.(\d+)\.")


def _plain(value) -> bool:
    """A timm option's value: a number, string, bool, None or a tuple or list of them."""
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    return value is None or isinstance(value, (bool, str)) or _number()(value)


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
    check_entry(path, "model_config", saved, _is_dict, "a dict of the model's settings")
    known = set(CONFIG_COUNTS) | set(CONFIG_NAMES) | {"timm_kwargs"}
    unknown = sorted(map(repr, set(saved) - known))      # repr: a name may hold a line break
    if unknown:
        raise BarterError(f"{path}: model_config holds {', '.join(unknown[:3])}{' ...' if len(unknown) > 3 else ''}, "
                          "which this version's models do not have: retrain the run with this version")
    for name, low in CONFIG_COUNTS.items():
        if name in saved:
            check = _optional(_integer(low)) if name == "conv_channels" else _integer(low)
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
        isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) and p[0] not in TIMM_LOADING_OPTIONS
        and _plain(p[1]) for p in v), "(name, value) pairs of timm.create_model options that name no file or "
                                      "download (" + ", ".join(TIMM_LOADING_OPTIONS) + ")")
    try:
        config = ModelConfig.from_dict(saved)
    except TypeError as error:          # a field it lacks
        raise BarterError(f"{path}: model_config cannot be read ({error}): retrain the run with this version") from None

    allocation = checkpoint["allocation"]
    check_entry(path, "allocation", allocation, lambda v: isinstance(v, dict) and set(v) == {"heads", "ffn"} and all(
        isinstance(w, (list, tuple)) and len(w) == config.depth and all(map(_integer(0), w)) for w in v.values()),
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


# ----------------------------------------------------------------------------- the resume state

#: the optimizer's hyperparameters that are numbers (each >= 0 and finite) and flags (bool
#: or None), where a group holds them; ``betas`` is a pair in [0, 1]
OPTIMIZER_NUMBERS = ("lr", "initial_lr", "eps", "weight_decay")
OPTIMIZER_FLAGS = ("amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused",
                   "decoupled_weight_decay")


def check_resume_state(checkpoint: dict, path: Path,
                       parameter_groups: Callable[[torch.nn.Module], list[list]]) -> dict:
    """``checkpoint`` (a ``last.pt`` read with :data:`~barter_mini.training.checkpoints.RESUME_KEYS`) if the trainer can continue
    from it, else a one-line error naming ``path`` and the first entry that is wrong, what
    it must be and what it is: the model (:func:`check_model_entries`, :func:`check_weights`
    against the model built on the meta device), the optimizer's groups and moments (one
    group per :func:`~barter_mini.training.optimization.parameter_groups` group, each
    parameter's moments of its shape), every entry of ``resume``
    (:data:`RESUME_STATE_CHECKS`) and how they agree (``step <= total_steps``, ``epoch <=
    epochs + 1``, the top-level ``epoch`` and ``step`` those of ``resume``), the LR
    schedule's entries that timm computes with (``_check_scheduler``), and every random
    generator's state, tried on a throwaway generator (``_check_generators``,
    ``_check_bit_generators``). The rest of the method's own state is its controller's
    to check when it loads it."""
    path = Path(path)
    config, allocation = check_model_entries(checkpoint, path)
    model = model_shapes(config, allocation, path, len(checkpoint["model"]))
    check_weights(model.state_dict(), checkpoint["model"], path)
    _check_optimizer(checkpoint["optimizer"], parameter_groups(model), path)
    state = checkpoint["resume"]
    missing = [name for name in RESUME_STATE_CHECKS if name not in state]
    if missing:
        raise BarterError(f"{path}: resume lacks {', '.join(missing)}, which resuming the run needs: "
                          "retrain the run (into a new --out)")
    for name, (check, allowed) in RESUME_STATE_CHECKS.items():
        check_entry(path, f"resume.{name}", state[name], check, allowed)
    total, epochs = state["total_steps"], state["epochs"]
    check_entry(path, "resume.step", state["step"], lambda step: step <= total,
                 f"at most resume.total_steps ({total})")
    check_entry(path, "resume.epoch", state["epoch"], lambda epoch: epoch <= epochs + 1,
                 f"at most resume.epochs + 1 ({epochs + 1})")
    check_entry(path, "step", checkpoint["step"], lambda step: step == state["step"],
                 f"resume.step ({state['step']})")
    check_entry(path, "epoch", checkpoint["epoch"], lambda epoch: epoch == state["epoch"] - 1,
                 f"resume.epoch - 1 ({state['epoch'] - 1}), the epochs completed")
    _check_scheduler(state["scheduler"], path)
    for number, generators in enumerate(state["rng"]):
        _check_generators(generators, path, f"resume.rng[{number}]")
    _check_bit_generators(checkpoint["controller"], path, "controller")
    return checkpoint


def _generator_state_error(state) -> str | None:
    """Why ``state`` cannot be a torch generator's state (a throwaway generator takes it), or None."""
    if not torch.is_tensor(state) or state.dtype != torch.uint8 or state.dim() != 1:
        return f"it is {_shown(state)}"
    try:
        torch.Generator().set_state(state)
    except RuntimeError as error:
        return str(error).strip().splitlines()[0][:120] if str(error).strip() else type(error).__name__
    return None


def _check_generators(state: dict, path: Path, where: str) -> None:
    """One process's generator states (:func:`~barter_mini.training.random_state.capture_generators`),
    each tried on a throwaway generator of its kind the way
    :func:`~barter_mini.training.random_state.restore_generators` restores it, so a state the
    restore would fail on (an integer out of range: an OverflowError) is refused here."""
    def refuse(name: str, why: str) -> None:
        raise BarterError(f"{path}: {where}.{name} is not a state of {name}'s random generator ({why}): "
                          "the file is damaged; retrain the run (into a new --out)")

    def restore_numpy() -> None:         # restore_generators' own conversion: the key was saved as ints
        saved = state["numpy"]
        np.random.RandomState().set_state({**saved, "state": {"key": np.asarray(saved["state"]["key"], dtype=np.uint32),
                                                              "pos": saved["state"]["pos"]}})

    for name, restore in (("python", lambda: random.Random().setstate(state["python"])), ("numpy", restore_numpy)):
        why = None
        try:
            restore()
        # any error at all: the call only reads the file's data into a throwaway generator
        except Exception as error:      # noqa: BLE001
            why = type(error).__name__
        if why is not None:
            refuse(name, why)
    why = _generator_state_error(state["torch"])
    if why is not None:
        refuse("torch", why)
    cuda = state["cuda"]
    if not (cuda is None or isinstance(cuda, list) and all(
            torch.is_tensor(t) and t.dtype == torch.uint8 for t in cuda)):
        refuse("cuda", f"None or a list of uint8 tensors, found {_shown(cuda)}")


#: the NumPy bit generators a state may name (a name is looked up only among these)
BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")


def _check_bit_generators(value, path: Path, where: str) -> None:
    """Every NumPy bit generator state inside ``value`` (a dict naming its ``bit_generator``,
    as a method's ``numpy.random.Generator`` saves it) loads into a throwaway bit generator
    of its kind: one the method's own restore would fail on is refused here, naming it."""
    if isinstance(value, dict):
        if "bit_generator" in value:
            name = value["bit_generator"]
            try:
                if name not in BIT_GENERATORS:
                    raise ValueError(name)
                getattr(np.random, name)().state = value
            except Exception as error:      # noqa: BLE001 (a throwaway generator reads the file's data only)
                raise BarterError(f"{path}: {where} is not a state of a NumPy bit generator "
                                  f"({type(error).__name__}): the file is damaged; retrain the run "
                                  "(into a new --out)") from None
            return
        for key, item in value.items():
            _check_bit_generators(item, path, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for number, item in enumerate(value):
            _check_bit_generators(item, path, f"{where}[{number}]")


def _check_optimizer(saved: dict, groups: list[list], path: Path) -> None:
    # groups: the parameters of each group the trainer's optimizer is built from, in order;
    # torch's load_state_dict pairs the saved parameters with its parameters in that order
    saved_groups = saved.get("param_groups")       # saved is a dict: load_checkpoint checked it

    def group_fits(group, params) -> bool:
        return isinstance(group, dict) and isinstance(group.get("params"), list) \
            and len(group["params"]) == len(params) and all(map(_integer(0), group["params"]))
    fits = isinstance(saved.get("state"), dict) and isinstance(saved_groups, list) \
        and len(saved_groups) == len(groups) and all(map(group_fits, saved_groups, groups))
    ids = [i for group in saved_groups for i in group["params"]] if fits else []
    if not fits or len(set(ids)) != len(ids):
        found = f"{len(saved_groups)} groups" if isinstance(saved_groups, list) else "no list of groups"
        raise BarterError(f"{path}: the optimizer's state must be a dict of state and param_groups, "
                          f"{len(groups)} groups of {', '.join(str(len(g)) for g in groups)} distinct parameter "
                          f"numbers (the model's), got {found}: the file is damaged; retrain the run")
    for number, group in enumerate(saved_groups):
        for key in OPTIMIZER_NUMBERS:
            if key in group:
                check_entry(path, f"optimizer group {number}'s {key}", group[key], _number(0.0),
                             "a finite number >= 0")
        if "betas" in group:
            check_entry(path, f"optimizer group {number}'s betas", group["betas"], lambda b: isinstance(
                b, (list, tuple)) and len(b) == 2 and all(map(_number(0.0, 1.0), b)), "a pair of numbers in [0, 1]")
        for key in OPTIMIZER_FLAGS:
            if key in group:
                check_entry(path, f"optimizer group {number}'s {key}", group[key],
                             lambda v: v is None or isinstance(v, bool), "True, False or None")
    params = dict(zip(ids, (p for g in groups for p in g)))
    for number, moments in saved["state"].items():
        if number not in params:
            raise BarterError(f"{path}: the optimizer holds a state for parameter {_shown(number)}, and its groups "
                              f"number {len(params)} parameters: the file is damaged; retrain the run")
        check_entry(path, f"the optimizer's state of parameter {number}", moments,
                     lambda m: isinstance(m, dict) and all(isinstance(k, str) for k in m), "a dict")
        want = list(params[number].shape)
        for key, value in moments.items():      # a scalar (the step count) or a tensor of the parameter's shape
            check_entry(path, f"the optimizer's {key} of parameter {number}", value, lambda v: _number()(v) or (
                torch.is_tensor(v) and (v.dim() == 0 or list(v.shape) == want)),
                f"a number or a tensor of the parameter's shape {want}")


def _check_scheduler(saved: dict, path: Path) -> None:
    """Refuse an LR schedule state that timm's ``CosineLRScheduler.load_state_dict`` (which
    sets every entry as an attribute) would turn into an error or an endless loop: an entry
    of another type than timm's own (numbers finite), ``t_initial`` < 1 (it divides by it),
    ``cycle_mul`` or ``k_decay`` <= 0 (a logarithm's base, a power of 0), ``cycle_limit`` < 1,
    ``warmup_t`` < 0, noise (barter-mini schedules none; timm draws noise until it is below
    ``noise_pct``), or an entry that would replace one of the scheduler's methods."""
    reference = CosineLRScheduler(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), t_initial=2,
                                  t_in_epochs=False).state_dict()
    for key, value in saved.items():
        # an entry timm's scheduler does not have (another timm version's) is kept, unless it
        # would replace what the scheduler calls or steps (a method, its optimizer)
        if key not in reference and (not isinstance(key, str) or key == "optimizer" or hasattr(CosineLRScheduler, key)):
            raise BarterError(f"{path}: resume.scheduler holds {_shown(key)}, which would replace the scheduler's "
                              "own; the file is damaged or not barter-mini's: retrain the run (into a new --out)")
        own = reference.get(key, value)
        kind = ("True or False" if isinstance(own, bool) else "an integer" if isinstance(own, int) else
                "a finite number" if _real(own) else "a string" if isinstance(own, str) else
                "a list of finite numbers" if isinstance(own, list) else "None" if own is None else type(own).__name__)
        check = {"True or False": lambda v: isinstance(v, bool), "an integer": _integer(-2**63),
                 "a finite number": _number(), "a string": lambda v: isinstance(v, str),
                 "a list of finite numbers": _list_of(_number()), "None": lambda v: v is None}.get(
            kind, lambda v: type(v) is type(own))
        check_entry(path, f"resume.scheduler.{key}", value, check, kind)
    ranges = {"t_initial": (_integer(1), "an integer >= 1"), "warmup_t": (_integer(0), "an integer >= 0"),
              "cycle_limit": (_integer(1), "an integer >= 1"),
              "cycle_mul": (lambda v: v > 0, "a number > 0"), "k_decay": (lambda v: v > 0, "a number > 0"),
              "noise_range_t": (lambda v: v is None, "None")}
    for key, (check, allowed) in ranges.items():
        if key in saved:
            check_entry(path, f"resume.scheduler.{key}", saved[key], check, allowed)
