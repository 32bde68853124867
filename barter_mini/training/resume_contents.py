"""What a ``last.pt`` must hold for the trainer to continue from it, checked entry by entry
(:func:`check_resume_state`): the model and its weights
(:mod:`~barter_mini.training.checkpoint_contents`), the optimizer's groups and moments, every
entry of the trainer's ``resume`` state and how they agree, the LR schedule, and every random
generator's state, each refused in one line that names the file and the entry."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from timm.scheduler import CosineLRScheduler

from ..errors import BarterError
from .checkpoint_contents import (are_scores, check_entry, check_model_entries, check_weights, integer, is_dict,
                                  is_real, is_record, list_of, model_shapes, finite_number, optional, shown)


#: every entry of ``last.pt``'s ``resume`` (the trainer's ``resume_state``) and what it must
#: be for the trainer to continue from it (:func:`check_resume_state`)
RESUME_STATE_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "train_gflops": (finite_number(0.0), "a finite number >= 0"),
    "update_seconds": (finite_number(0.0), "a finite number >= 0"),
    "step": (integer(0), "an integer >= 0"),
    "skipped_steps": (integer(0), "an integer >= 0"),
    "best_acc": (finite_number(-1.0, 1.0), "a number in [-1, 1]"),
    "history": (list_of(is_record), "a list of dicts of numbers"),
    "curve": (list_of(is_record), "a list of dicts of numbers"),
    "window": (list_of(lambda pair: isinstance(pair, (list, tuple)) and len(pair) == 2 and all(map(is_real, pair))),
               "a list of (loss, accuracy) pairs"),
    "step_losses": (list_of(is_real), "a list of numbers"),
    "epoch": (integer(1), "an integer >= 1"),
    "batches_done": (integer(0), "an integer >= 0"),
    "epoch_losses": (list_of(is_real), "a list of numbers"),
    "epoch_loader_state": (optional(lambda state: _generator_state_error(state) is None),
                           "None or the state of a torch generator"),
    "last_val": (optional(are_scores), "None or the validation scores {acc, macro_f1} in [0, 1]"),
    "total_steps": (integer(1), "an integer >= 1"),
    "epochs": (integer(1), "an integer >= 1"),
    "scheduler": (is_dict, "a dict (timm's scheduler state)"),
    "rng": (lambda states: isinstance(states, list) and len(states) > 0 and all(
        isinstance(state, dict) and {"python", "numpy", "torch", "cuda"} <= set(state) for state in states),
            "a list of every process's generator states (dicts of python, numpy, torch, cuda)"),
    "scaler": (optional(is_dict), "None or a dict (the fp16 loss scaler's state)"),
    "elapsed_s": (finite_number(0.0), "a finite number >= 0"),
}

#: the optimizer's hyperparameters that are numbers (each >= 0 and finite) and flags (bool
#: or None), where a group holds them; ``betas`` is a pair in [0, 1]
OPTIMIZER_NUMBERS = ("lr", "initial_lr", "eps", "weight_decay")
OPTIMIZER_FLAGS = ("amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused",
                   "decoupled_weight_decay")


def check_resume_state(checkpoint: dict, path: Path,
                       parameter_groups: Callable[[torch.nn.Module], list[list]]) -> dict:
    """``checkpoint`` (a ``last.pt`` read with :data:`~barter_mini.training.checkpoints.RESUME_KEYS`) if the trainer can continue
    from it, else a one-line error naming ``path`` and the first entry that is wrong, what
    it must be and what it is: the model (:func:`~barter_mini.training.checkpoint_contents.check_model_entries`,
    :func:`~barter_mini.training.checkpoint_contents.check_weights`
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
        return f"it is {shown(state)}"
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
        refuse("cuda", f"None or a list of uint8 tensors, found {shown(cuda)}")


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
            raise BarterError(f"{path}: resume.scheduler holds {shown(key)}, which would replace the scheduler's "
                              "own; the file is damaged or not barter-mini's: retrain the run (into a new --out)")
        own = reference.get(key, value)
        kind = ("True or False" if isinstance(own, bool) else "an integer" if isinstance(own, int) else
                "a finite number" if is_real(own) else "a string" if isinstance(own, str) else
                "a list of finite numbers" if isinstance(own, list) else "None" if own is None else type(own).__name__)
        check = {"True or False": lambda v: isinstance(v, bool), "an integer": integer(-2**63),
                 "a finite number": finite_number(), "a string": lambda v: isinstance(v, str),
                 "a list of finite numbers": list_of(finite_number()), "None": lambda v: v is None}.get(
            kind, lambda v: type(v) is type(own))
        check_entry(path, f"resume.scheduler.{key}", value, check, kind)
    ranges = {"t_initial": (integer(1), "an integer >= 1"), "warmup_t": (integer(0), "an integer >= 0"),
              "cycle_limit": (integer(1), "an integer >= 1"),
              "cycle_mul": (lambda v: v > 0, "a number > 0"), "k_decay": (lambda v: v > 0, "a number > 0"),
              "noise_range_t": (lambda v: v is None, "None")}
    for key, (check, allowed) in ranges.items():
        if key in saved:
            check_entry(path, f"resume.scheduler.{key}", saved[key], check, allowed)
