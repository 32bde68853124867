"""Training: AdamW with warm-up and cosine LR, label smoothing, the method's controller, metrics.

:func:`train` is three steps: :func:`build_training` (data, model and length from
:mod:`~barter_mini.training.run_inputs`, the parts from :func:`~barter_mini.training.parts.build_parts`,
the LR schedule), :func:`fit_one_epoch` (the loop, with the
controller's ``before_step`` / ``after_step`` around every optimizer step) and
:func:`finalize` (test the best checkpoint, write the metrics). A run folder holds ``best.pt`` (chosen on validation Top-1), ``last.pt`` and
``metrics.json``: validation and test Top-1 and macro-F1 (fractions, test measured with the
best checkpoint), wall time, transfers planned and executed, the per-epoch history and the
per-layer allocation after every topology update, a training curve (running loss and
accuracy every ``LOG_EVERY`` steps), the training losses around every update
(``update_losses``) and halfway between updates, where nothing changed the model
(``control_losses``: the training's own drift), the time the updates took
(``update_time_s``), and the cumulative
training compute ``train_pflops``: the sum over steps of the batch size times the training
FLOPs per image (3 x forward) of the tensors as they were at that step. All files are
written atomically.

A run survives interruption: ``last.pt`` (:meth:`Training.checkpoint`) holds the trainer's
position inside the epoch, every RNG, the LR schedule and the records beside the model,
optimizer and controller states, and :func:`train` with ``resume`` continues from it
exactly (:func:`resume_training`); SIGTERM and SIGINT write it at the end of the step in
progress. The folder itself (its lock, one run per folder, where a resumed run continues
from) is :mod:`~barter_mini.training.run_folder`'s; the optimizer, loss and recipe are
:mod:`~barter_mini.training.optimization`'s. Under ``torchrun`` one run trains on several
processes (:mod:`~barter_mini.training.parallel`).

A run may start from a trained dense model (``init``, :mod:`~barter_mini.training.finetune`),
keep only some classes (``classes``), and train for a compute budget (``pflops``) instead of
epochs: :func:`~barter_mini.training.run_inputs.steps_for_compute` steps, over which the LR and update schedules are laid.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
from timm.scheduler import CosineLRScheduler
from torch import nn
from tqdm import tqdm

from ..version import __version__
from ..core import distributed
from ..core.configs import ModelConfig
from ..core.compilation import graphs_compiled
from ..core.counting import count_parameters, training_gflops_per_image
from ..core.method import MethodController
from ..core.models import get_model_config
from ..core.surgery import allocation_of
from ..errors import BarterError, TrainingDiverged, TrainingInterrupted, check_integer
from .checkpoints import CHECKPOINT_FORMAT, RUN_KEYS, check_can_create, load_checkpoint, model_from_checkpoint, write_json
from . import parallel, run_folder
from .data import make_loaders
from .evaluation import evaluate
from .loss_records import LOG_EVERY, check_recent_losses, read_losses
from .divergence import check_validation_loss, divergence_record, diverged_again
from .methods import get_method
from .random_state import capture_generators, restore_generators
from .run_config import RunConfig
from .parts import RunParts, build_parts
from .run_inputs import build_run_model, load_splits, run_length
from .optimization import resolve_device, resolve_recipe, seed_everything
from .recipes import Recipe

#: steps before and after every topology or mask update whose training losses metrics.json
#: keeps (``update_losses``): where a cold start would show as a loss spike
UPDATE_WINDOW = 10


@dataclass
class Progress:
    """How far a run has come: what ``last.pt`` keeps (``resume``) and a resumed run restores,
    through one symmetric pair, :meth:`state_dict` and :meth:`load_state_dict`."""

    #: the cumulative training GFLOPs so far: each segment between topology updates at its own cost
    train_gflops: float = 0.0
    #: wall seconds spent in the controller's after_step calls that changed the model
    update_seconds: float = 0.0
    step: int = 0
    #: batches whose fp16 gradients overflowed: trained on, but no optimizer step (not in ``step``)
    skipped_steps: int = 0
    best_acc: float = -1.0
    history: list = field(default_factory=list)
    curve: list = field(default_factory=list)
    window: list = field(default_factory=list)
    #: the training loss of every step so far (for the windows around updates)
    step_losses: list = field(default_factory=list)
    #: the epoch in progress or next to start (1-based), the batches of it already trained,
    #: their losses, and the training loader's generator state at its start
    epoch: int = 1
    batches_done: int = 0
    epoch_losses: list = field(default_factory=list)
    epoch_loader_state: torch.Tensor | None = None
    #: the last completed epoch's validation scores
    last_val: dict | None = None

    def state_dict(self) -> dict:
        return {spec.name: _copy(getattr(self, spec.name)) for spec in fields(self)}

    def load_state_dict(self, state: dict) -> None:
        for spec in fields(self):
            setattr(self, spec.name, _copy(state[spec.name]))


def _copy(value):
    return list(value) if isinstance(value, list) else value


@dataclass
class Training:
    """A run in progress: its settings, its parts (:func:`~barter_mini.training.parts.build_parts`,
    frozen), its data, LR schedule and length, and its :class:`Progress`; what
    :func:`build_training` sets up and :func:`fit_one_epoch` advances."""

    def __setattr__(self, name: str, value) -> None:
        if name in ("parts", "model", "optimizer", "controller") and "parts" in self.__dict__:
            raise BarterError("a run's parts are fixed when it is built: its graphed step and its checkpoints "
                              "hold them; wrap the controller through build_training(wrap_controller=...)")
        super().__setattr__(name, value)

    run: RunConfig
    recipe: Recipe
    config: ModelConfig
    device: torch.device
    parts: RunParts
    scheduler: CosineLRScheduler
    loaders: tuple
    total_steps: int
    started: float
    #: training GFLOPs per image of the tensors as they are now (3 x forward; recomputed on resume)
    gflops_per_image: float = 0.0
    progress: Progress = field(default_factory=Progress)
    #: what the training step calls: the model, or its DDP replica (training.parallel)
    forward: nn.Module | None = None
    #: Dynamo's graph count when the run started (--compile: the difference counts recompiles)
    graphs_at_start: int = 0
    #: why the run stopped for divergence (:func:`~barter_mini.training.divergence.divergence_record`), else None: last.pt keeps
    #: it, so a resume of a diverged run stops with the same line instead of training on
    diverged: dict | None = None
    #: optimizer steps between host reads of the training loss and accuracy
    #: (:func:`~barter_mini.training.loss_records.read_losses`): 1 reads and checks each loss
    #: before its backward pass; a graphed run keeps them on the device and reads
    #: :data:`~barter_mini.training.loss_records.LOG_EVERY` at once, one transfer, not a wait per step
    read_every: int = 1
    #: ``(loss, accuracy, stepped, step)`` of the batches not yet recorded (tensors where unread)
    unread: list = field(default_factory=list)

    @property
    def model(self) -> nn.Module:
        return self.parts.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.parts.optimizer

    @property
    def controller(self) -> MethodController:
        return self.parts.controller

    def checkpoint(self) -> dict:
        """The model and everything needed to continue exactly from here (:func:`resume_training`)."""
        p = self.progress
        return {"format": CHECKPOINT_FORMAT, "version": __version__, "run": asdict(self.run),
                "recipe": asdict(self.recipe), "model_config": asdict(self.config),
                "allocation": allocation_of(self.model).as_dict(), "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "controller": self.controller.state_dict(),
                "epoch": p.epoch - 1, "step": p.step, "val": p.last_val,
                "resume": self.resume_state(), "diverged": self.diverged}

    def resume_state(self) -> dict:
        """The trainer's side of an exact resume: the :class:`Progress` (position in the data,
        records), the length fixed when the run started, the LR schedule, every process's
        random generators (they draw different augmentations), the loss scaler and the
        elapsed time."""
        scaler = self.parts.scaler
        return {**self.progress.state_dict(), "total_steps": self.total_steps, "epochs": self.recipe.epochs,
                "scheduler": self.scheduler.state_dict(), "rng": distributed.all_gather(capture_generators()),
                "scaler": None if scaler is None else scaler.state_dict(),
                "elapsed_s": time.perf_counter() - self.started}

    def load_resume_state(self, state: dict) -> None:
        """Restore :meth:`resume_state` (the length and recipe: :func:`~barter_mini.training.run_inputs.run_length`)."""
        self.progress.load_state_dict(state)
        self.scheduler.load_state_dict(state["scheduler"])
        if self.parts.scaler is not None:
            self.parts.scaler.load_state_dict(state["scaler"])
        if self.progress.epoch_loader_state is not None:     # the shuffle of the epoch the run continues in
            self.loaders[0].generator.set_state(self.progress.epoch_loader_state)
        self.started = time.perf_counter() - state["elapsed_s"]


def build_training(run: RunConfig, checkpoint: dict | None = None, wrap_controller=None) -> Training:
    """Data, model, LR schedule and the run's parts (:func:`~barter_mini.training.parts.build_parts`:
    optimizer, the method's controller, loss, execution, graphed step); from a ``last.pt``
    ``checkpoint`` of the same run, everything as it was when it was written
    (:func:`resume_training`). ``wrap_controller(controller, model, recipe, loaders, device)``
    may wrap the method's controller (a probe of its updates) before anything holds it: the
    parts are frozen, so a graphed step and a checkpoint can never hold another controller
    than the run's."""
    run = run.validate()
    device = parallel.process_device(resolve_device(run.device))
    seed_everything(run.seed)
    base_config = get_model_config(run.model)
    recipe = resolve_recipe(run, base_config.family)
    splits = load_splits(run, recipe)
    loaders = make_loaders(splits, recipe.batch_size, run.seed, rank=distributed.rank(),
                           world_size=distributed.world_size(), device=device)
    config = base_config.for_data(splits.info.img_size, splits.info.in_chans, splits.info.num_classes)
    model = build_run_model(run, config, recipe, splits, device, checkpoint)
    gflops = training_gflops_per_image(model)
    total_steps, recipe = run_length(run, recipe, len(loaders[0]), gflops, checkpoint)
    wrap = None if wrap_controller is None else (
        lambda controller: wrap_controller(controller, model, recipe, loaders, device))
    parts = build_parts(run, model, recipe, total_steps, device, wrap_controller=wrap,
                        distributed=distributed.is_distributed())
    cosine_log = logging.getLogger("timm.scheduler.cosine_lr")
    level = cosine_log.level
    if total_steps == 1:        # one step has no schedule to anneal: timm's warning that says so is noise
        cosine_log.setLevel(logging.ERROR)
    try:
        scheduler = CosineLRScheduler(
            parts.optimizer, t_initial=total_steps, lr_min=recipe.min_lr,
            warmup_t=int(recipe.warmup_fraction * total_steps), warmup_lr_init=recipe.lr * 0.01,
            warmup_prefix=True, t_in_epochs=False)
    finally:
        cosine_log.setLevel(level)
    t = Training(run, recipe, config, device, parts, scheduler, loaders, total_steps, started=time.perf_counter(),
                 gflops_per_image=gflops)
    if checkpoint is not None:
        try:
            resume_training(t, checkpoint)
        except BarterError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError, ArithmeticError) as error:
            # the method's own state is its controller's to read: what it meets in a damaged one
            raise BarterError(f"the last.pt to resume from does not fit this run ({type(error).__name__}: "
                              f"{str(error).splitlines()[0][:160] if str(error) else ''}): "
                              "train it again into a new --out") from None
    elif distributed.is_distributed():   # the model is built: now each process draws its own augmentations
        torch.manual_seed(int(np.random.SeedSequence([run.seed, distributed.rank()]).generate_state(1)[0]))
    t.graphs_at_start = graphs_compiled()
    t.forward = parallel.wrap(t.model, device)
    t.read_every = LOG_EVERY if parts.graphed is not None else 1
    return t


def resume_training(t: Training, checkpoint: dict) -> None:
    """Put a freshly built run (tensors already of the checkpoint's sizes) back where
    ``checkpoint`` left it: weights, optimizer moments (its parameter groups already point at
    this model's tensors), the controller's statistics, masks, RNGs and counts, and the
    trainer's :meth:`~Training.resume_state` (LR schedule, progress, position in the epoch).

    Every random generator is restored last: building the model drew from them."""
    state = checkpoint["resume"]
    t.model.load_state_dict(checkpoint["model"])
    t.optimizer.load_state_dict(checkpoint["optimizer"])
    t.controller.load_state_dict(checkpoint["controller"])
    t.load_resume_state(state)
    t.gflops_per_image = training_gflops_per_image(t.model)
    restore_generators(parallel.own_state(state["rng"], "random generators"))


def train_step(t: Training, x: torch.Tensor, y: torch.Tensor) -> tuple:
    """One optimizer step of the run on ``(x, y)`` (:meth:`~barter_mini.training.parts.RunParts.step`)
    and its bookkeeping: the LR schedule, the compute spent, the update's time and, after a
    topology update, the tensors' new cost and a new DDP wrapper. Returns the batch's loss and
    accuracy averaged over processes, and whether an optimizer step was taken (under fp16 a
    step whose gradients overflowed is not: it counts in ``skipped_steps``, not in ``step``).

    With ``t.read_every == 1`` loss and accuracy are read before backward, as floats: a
    non-finite loss stops the run (:class:`~barter_mini.errors.TrainingDiverged`) before its
    gradients reach the weights, the optimizer or the method's statistics. Otherwise (a graphed
    run) they are returned as tensors on the device, and
    :func:`~barter_mini.training.loss_records.read_losses` reads and checks
    them with the others of its interval."""
    measured: list = []
    progress = t.progress

    def check_loss(loss: torch.Tensor, logits: torch.Tensor) -> None:
        measured.extend(parallel.mean_over_processes(loss.item(), (logits.argmax(dim=1) == y).float().mean().item()))
        if not math.isfinite(measured[0]):
            raise TrainingDiverged(progress.step + 1, f"the training loss is {measured[0]}")

    deferred = t.read_every > 1
    outcome = t.parts.step(x, y, progress.step + 1, check_loss=None if deferred else check_loss, forward=t.forward)
    if deferred:         # copies: a graph's next replay overwrites its output buffers
        measured = [outcome.loss.detach().float().clone(), (outcome.logits.argmax(dim=1) == y).float().mean()]
    progress.train_gflops += t.gflops_per_image * x.shape[0] * distributed.world_size()
    if outcome.skipped:
        progress.skipped_steps += 1
        return measured[0], measured[1], False
    progress.step += 1
    t.scheduler.step_update(progress.step)          # no controller reads the LR: after its update is the same
    if outcome.changed is not None:
        progress.update_seconds += outcome.update_seconds
        if not get_method(t.run.method).full_width:
            t.gflops_per_image = training_gflops_per_image(t.model)  # the tensors changed size
            t.forward = parallel.wrap(t.model, t.device)      # DDP's buckets hold the old tensors
    return measured[0], measured[1], True


def fit_one_epoch(t: Training, after_each_step=None) -> dict:
    """Train the rest of epoch ``t.progress.epoch`` (all of it unless resumed inside it), the method's
    controller around every optimizer step and ``after_each_step(t)`` after it (checkpoints,
    interruptions); return the epoch's history entry (train loss, validation scores, LR,
    elapsed time) and move ``t`` to the next epoch."""
    p = t.progress
    t.model.train()
    loader, epoch = t.loaders[0], p.epoch
    if p.batches_done == 0:
        p.epoch_loader_state, p.epoch_losses = loader.generator.get_state(), []
    else:                             # resumed inside the epoch (resume_training set its shuffle)
        loader.batch_sampler.skip = p.batches_done       # its first batches passed over
    bar = tqdm(loader, desc=f"{t.run.method} epoch {epoch}/{t.recipe.epochs}", initial=p.batches_done,
               disable=(None if t.run.progress is None else not t.run.progress), leave=False)
    for x, y in ([] if p.step >= t.total_steps else bar):
        x, y = x.to(t.device, non_blocking=True), y.to(t.device, non_blocking=True)
        t.unread.append((*train_step(t, x, y), p.step))
        if len(t.unread) >= t.read_every:
            bar.set_postfix(loss=f"{read_losses(t):.3f}")
        p.batches_done += 1
        if after_each_step is not None:
            after_each_step(t)
        if p.step >= t.total_steps:          # a compute budget can end inside an epoch
            break
    bar.close()
    check_recent_losses(t)               # reads what is still on the device; a divergence it sees is named first
    val = evaluate(t.model, t.loaders[1], t.device, t.parts.execution)
    check_validation_loss(val["loss"], p.step, t.config.num_classes)
    entry = {"epoch": epoch, "step": p.step, "train_loss": float(np.mean(p.epoch_losses)),
             "val_acc": val["acc"], "val_macro_f1": val["macro_f1"],
             "lr": t.optimizer.param_groups[0]["lr"], "elapsed_s": time.perf_counter() - t.started}
    p.history.append(entry)
    p.last_val = {"acc": val["acc"], "macro_f1": val["macro_f1"]}
    p.epoch, p.batches_done, p.epoch_losses = epoch + 1, 0, []
    p.epoch_loader_state = loader.generator.get_state()        # where the next epoch's shuffle starts
    return entry


def save_epoch(t: Training, out: Path) -> None:
    """``last.pt`` after every epoch, ``best.pt`` when validation Top-1 improved."""
    check_recent_losses(t)
    improved = t.progress.last_val["acc"] > t.progress.best_acc
    if improved:
        t.progress.best_acc = t.progress.last_val["acc"]
    state = t.checkpoint()
    if improved:
        run_folder.write_checkpoint(out / "best.pt", state)
    run_folder.write_checkpoint(out / "last.pt", state)


def update_losses(step_losses: list[float], updates: list[int], window: int = UPDATE_WINDOW) -> list[dict]:
    """Per update step ``u`` (an optimizer step after which the method changed the model):
    the training losses of steps ``u - window + 1 .. u`` (``before``) and ``u + 1 .. u + window``
    (``after``), as far as the run went. ``step_losses[i]`` is the loss of step ``i + 1``."""
    return [{"step": u, "before": step_losses[max(0, u - window):u], "after": step_losses[u:u + window]}
            for u in updates if u < len(step_losses)]


def control_steps(updates: list[int]) -> list[int]:
    """The steps halfway between consecutive updates, ``(u_i + u_{i+1}) // 2``: the control
    windows of :func:`update_losses`. A window there measures the same loss change as around
    an update, in the same run, where nothing changed the model, so it is the training's own
    drift that an update's change must be read against."""
    return [(a + b) // 2 for a, b in zip(updates, updates[1:]) if b - a > 1]


def finalize(t: Training, out: Path) -> dict:
    """Test the best checkpoint and write ``metrics.json``; return the metrics."""
    train_time = time.perf_counter() - t.started
    best = load_checkpoint(out / "best.pt", map_location=t.device, keys=RUN_KEYS, use="testing the best model")
    best_model = model_from_checkpoint(best, t.device, path=out / "best.pt")
    test = evaluate(best_model, t.loaders[2], t.device, t.parts.execution)
    run = t.run
    metrics = {
        "version": __version__, "method": run.method, "model": run.model, "dataset": run.dataset,
        "density": run.density, "seed": run.seed, "recipe": t.recipe.name, "epochs": t.recipe.epochs,
        "device": t.device.type, "steps": t.progress.step, "best_epoch": best["epoch"],
        "val_acc": best["val"]["acc"], "val_macro_f1": best["val"]["macro_f1"],
        "test_acc": test["acc"], "test_macro_f1": test["macro_f1"],
        "wall_time_s": time.perf_counter() - t.started, "train_time_s": train_time,
        "params": count_parameters(best_model),
        "train_gflops_per_image": training_gflops_per_image(best_model),
        "train_pflops": t.progress.train_gflops / 1e6,
        "update_time_s": t.progress.update_seconds, "update_ms_per_step": 1000 * t.progress.update_seconds / max(1, t.progress.step),
        "skipped_steps": t.progress.skipped_steps,
        "allocation": best["allocation"], "history": t.progress.history, "curve": t.progress.curve,
        "update_losses": update_losses(t.progress.step_losses, t.controller.changing_steps()),
        "control_losses": update_losses(t.progress.step_losses, control_steps(t.controller.changing_steps())),
        **t.controller.metrics(), "processes": distributed.world_size(), "threads": torch.get_num_threads(),
        "graphs_compiled": graphs_compiled() - t.graphs_at_start if run.compile else 0,
        **(t.parts.graphed.metrics() if t.parts.graphed is not None else {}),
        "run": asdict(run), "recipe_settings": asdict(t.recipe),
    }
    if distributed.is_main_process():
        run_folder.check_still_held(out)
        write_json(out / "metrics.json", metrics)
    parallel.barrier()
    return metrics


def train(run: RunConfig, out: str | Path, resume: bool = False, checkpoint_every: int | None = None) -> dict:
    """Train one run into the folder ``out`` and return its metrics (also in metrics.json).

    ``last.pt`` is written after every epoch, every ``checkpoint_every`` optimizer steps, and
    when SIGTERM or SIGINT arrives (then :class:`~barter_mini.errors.TrainingInterrupted` is raised). With
    ``resume``, a finished run in ``out`` is returned as it is and an unfinished one continues
    from its ``last.pt`` exactly where it stopped: on the same CPU, thread count and data, the
    weights and metrics (all but wall times) are bitwise those of an uninterrupted run.
    """
    out = check_can_create(Path(out))      # before training: a bad --out fails at once
    if checkpoint_every is not None:
        checkpoint_every = check_integer("checkpoint_every", checkpoint_every)
    with run_folder.holding(out):
        checkpoint = None
        if resume:
            finished, checkpoint = run_folder.resume_point(out, run)
            if finished is not None:
                return finished
            if checkpoint is not None and checkpoint.get("diverged") is not None:
                raise diverged_again(checkpoint, out / "last.pt")
        else:
            run_folder.refuse_existing_run(out)
        return _train_in(run, out, checkpoint, checkpoint_every)


def _train_in(run: RunConfig, out: Path, checkpoint: dict | None, checkpoint_every: int | None) -> dict:
    with parallel.process_group(run.device), run_folder.interruptible() as received:
        t = build_training(run, checkpoint)

        def after_each_step(t: Training) -> None:
            if parallel.any_process(bool(received)):       # every process stops at the same step
                check_recent_losses(t)
                run_folder.write_checkpoint(out / "last.pt", t.checkpoint())
                raise TrainingInterrupted(received[0] if received else signal.SIGTERM, t.progress.step, out / "last.pt")
            if checkpoint_every is not None and t.progress.step % checkpoint_every == 0:
                check_recent_losses(t)
                run_folder.write_checkpoint(out / "last.pt", t.checkpoint())

        try:
            while t.progress.epoch <= t.recipe.epochs:
                fit_one_epoch(t, after_each_step)
                save_epoch(t, out)
        except TrainingDiverged as diverged:
            # the model, optimizer and records are those after the last step with finite
            # values: keep them (the cause can be studied, e.g. the weights' norms), say so,
            # and mark them diverged so that no resume trains on from them
            diverged.checkpoint, diverged.kept_step = out / "last.pt", t.progress.step
            diverged.hint = (f"the learning rate {t.recipe.lr:g} may be too high: "
                             "try a smaller --lr, in another --out")
            t.diverged = divergence_record(diverged)
            run_folder.write_checkpoint(out / "last.pt", t.checkpoint())
            raise
        return finalize(t, out)
