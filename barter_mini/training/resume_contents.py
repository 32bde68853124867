"""The checks of what a ``last.pt`` holds beyond its model, each a part's own
(:data:`~barter_mini.training.checkpoint_parts.PARTS`): the optimizer's groups and moments
(:func:`check_optimizer`), the LR schedule (:func:`check_scheduler`), every process's random
generators (:func:`check_generators`) and the NumPy generators inside a method's state
(:func:`check_bit_generators`), each refused in one line that names the file and the entry."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from timm.scheduler import CosineLRScheduler

from ..errors import BarterError
from .checkpoint_contents import check_entry, integer, is_real, list_of, finite_number, shown


#: the optimizer's hyperparameters that are numbers (each >= 0 and finite) and flags (bool
#: or None), where a group holds them; ``betas`` is a pair in [0, 1]
OPTIMIZER_NUMBERS = ("lr", "initial_lr", "eps", "weight_decay")
OPTIMIZER_FLAGS = ("amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused",
                   "decoupled_weight_decay")


def generator_state_error(state) -> str | None:
    """Why ``state`` cannot be a torch generator's state (a throwaway generator takes it), or None."""
    if not torch.is_tensor(state) or state.dtype != torch.uint8 or state.dim() != 1:
        return f"it is {shown(state)}"
    try:
        torch.Generator().set_state(state)
    except RuntimeError as error:
        return str(error).strip().splitlines()[0][:120] if str(error).strip() else type(error).__name__
    return None


def check_generators(state: dict, path: Path, where: str) -> None:
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
    why = generator_state_error(state["torch"])
    if why is not None:
        refuse("torch", why)
    cuda = state["cuda"]
    if not (cuda is None or isinstance(cuda, list) and all(
            torch.is_tensor(t) and t.dtype == torch.uint8 for t in cuda)):
        refuse("cuda", f"None or a list of uint8 tensors, found {shown(cuda)}")


#: the NumPy bit generators a state may name (a name is looked up only among these)
BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")


def check_bit_generators(value, path: Path, where: str) -> None:
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
            check_bit_generators(item, path, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for number, item in enumerate(value):
            check_bit_generators(item, path, f"{where}[{number}]")


def check_optimizer(saved: dict, groups: list[list], path: Path) -> None:
    # groups: the parameters of each group the trainer's optimizer is built from, in order;
    # torch's load_state_dict pairs the saved parameters with its parameters in that order
    saved_groups = saved.get("param_groups")       # saved is a dict: load_checkpoint checked it

    def group_fits(group, params) -> bool:
        return isinstance(group, dict) and isinstance(group.get("params"), list) \
            and len(group["params"]) == len(params) and all(map(integer(0), group["params"]))
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
                check_entry(path, f"optimizer group {number}'s {key}", group[key], finite_number(0.0),
                             "a finite number >= 0")
        if "betas" in group:
            check_entry(path, f"optimizer group {number}'s betas", group["betas"], lambda b: isinstance(
                b, (list, tuple)) and len(b) == 2 and all(map(finite_number(0.0, 1.0), b)), "a pair of numbers in [0, 1]")
        for key in OPTIMIZER_FLAGS:
            if key in group:
                check_entry(path, f"optimizer group {number}'s {key}", group[key],
                             lambda v: v is None or isinstance(v, bool), "True, False or None")
    params = dict(zip(ids, (p for g in groups for p in g)))
    for number, moments in saved["state"].items():
        if number not in params:
            raise BarterError(f"{path}: the optimizer holds a state for parameter {shown(number)}, and its groups "
                              f"number {len(params)} parameters: the file is damaged; retrain the run")
        check_entry(path, f"the optimizer's state of parameter {number}", moments,
                     lambda m: isinstance(m, dict) and all(isinstance(k, str) for k in m), "a dict")
        want = list(params[number].shape)
        for key, value in moments.items():      # a scalar (the step count) or a tensor of the parameter's shape
            check_entry(path, f"the optimizer's {key} of parameter {number}", value, lambda v: finite_number()(v) or (
                torch.is_tensor(v) and (v.dim() == 0 or list(v.shape) == want)),
                f"a number or a tensor of the parameter's shape {want}")


def check_scheduler(saved: dict, path: Path) -> None:
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
            raise BarterError(f"{path}: scheduler holds {shown(key)}, which would replace the scheduler's "
                              "own; the file is damaged or not barter-mini's: retrain the run (into a new --out)")
        own = reference.get(key, value)
        kind = ("True or False" if isinstance(own, bool) else "an integer" if isinstance(own, int) else
                "a finite number" if is_real(own) else "a string" if isinstance(own, str) else
                "a list of finite numbers" if isinstance(own, list) else "None" if own is None else type(own).__name__)
        check = {"True or False": lambda v: isinstance(v, bool), "an integer": integer(-2**63),
                 "a finite number": finite_number(), "a string": lambda v: isinstance(v, str),
                 "a list of finite numbers": list_of(finite_number()), "None": lambda v: v is None}.get(
            kind, lambda v: type(v) is type(own))
        check_entry(path, f"scheduler.{key}", value, check, kind)
    ranges = {"t_initial": (integer(1), "an integer >= 1"), "warmup_t": (integer(0), "an integer >= 0"),
              "cycle_limit": (integer(1), "an integer >= 1"),
              "cycle_mul": (lambda v: v > 0, "a number > 0"), "k_decay": (lambda v: v > 0, "a number > 0"),
              "noise_range_t": (lambda v: v is None, "None")}
    for key, (check, allowed) in ranges.items():
        if key in saved:
            check_entry(path, f"scheduler.{key}", saved[key], check, allowed)
