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
from dataclasses import asdict, dataclass, field
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
from ..errors import BarterError, TrainingDiverged, TrainingInterrupted, check_integer
from .checkpoint_parts import CheckpointManager, run_states
from .checkpoints import RUN_KEYS, check_can_create, load_checkpoint, model_from_checkpoint, write_json
from . import parallel, run_folder
from .data import make_loaders
from .evaluation import evaluate
from .loss_records import LOG_EVERY, check_recent_losses, read_losses
from .divergence import check_validation_loss, divergence_record, diverged_again
from .methods import get_method
from .run_config import RunConfig
from .parts import RunParts, build_parts
from .progress import Progress
from .run_inputs import build_run_model, load_splits, run_length
from .optimization import resolve_device, resolve_recipe, seed_everything
from .recipes import Recipe

#: steps before and after every topology or mask update whose training losses metrics.json
#: keeps (``update_losses``): where a cold start would show as a loss spike
UPDATE_WINDOW = 10


@dataclass(frozen=True)
class Training:
    """A run in progress: its settings, its parts (:func:`~barter_mini.training.parts.build_parts`),
    its data, LR schedule and length, fixed when :func:`build_training` sets it up (frozen: its
    graphed step and its checkpoints hold its parts, so none can be swapped), and its
    :class:`~barter_mini.training.progress.Progress`, all that :func:`fit_one_epoch` advances."""

    run: RunConfig
    recipe: Recipe
    config: ModelConfig
    device: torch.device
    parts: RunParts
    scheduler: CosineLRScheduler
    loaders: tuple
    total_steps: int
    progress: Progress = field(default_factory=Progress)
    #: Dynamo's graph count when the run started (--compile: the difference counts recompiles)
    graphs_at_start: int = 0
    #: optimizer steps between host reads of the training loss and accuracy
    #: (:func:`~barter_mini.training.loss_records.read_losses`): 1 reads and checks each loss
    #: before its backward pass; a graphed run keeps them on the device and reads
    #: :data:`~barter_mini.training.loss_records.LOG_EVERY` at once, one transfer, not a wait per step
    read_every: int = 1

    @property
    def model(self) -> nn.Module:
        return self.parts.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.parts.optimizer

    @property
    def controller(self) -> MethodController:
        return self.parts.controller

    @property
    def unread(self) -> list:
        """``(loss, accuracy, stepped, step)`` of the batches not yet recorded (tensors where unread)."""
        return self.progress.unread

    @property
    def checkpoints(self) -> CheckpointManager:
        """The run's parts as a checkpoint (:data:`~barter_mini.training.checkpoint_parts.PARTS`)."""
        return CheckpointManager(states=run_states(self))

    def checkpoint(self) -> dict:
        """The model and everything needed to continue exactly from here (:func:`resume_training`)."""
        return self.checkpoints.state_dict()


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
    t = Training(run, recipe, config, device, parts, scheduler, loaders, total_steps,
                 Progress(gflops_per_image=gflops), graphs_at_start=graphs_compiled(),
                 read_every=LOG_EVERY if parts.graphed is not None else 1)
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
    t.progress.forward = parallel.wrap(t.model, device)
    return t


def resume_training(t: Training, checkpoint: dict) -> None:
    """Put a freshly built run (tensors already of the checkpoint's sizes) back where
    ``checkpoint`` left it: every part of :data:`~barter_mini.training.checkpoint_parts.PARTS`
    loaded in its order (weights, optimizer moments, whose parameter groups already point at
    this model's tensors, the controller's statistics, masks, RNGs and counts, the progress,
    the LR schedule, the loss scaler; every random generator last: building the model drew
    from them), then the training loader's shuffle set to the epoch the run continues in."""
    t.checkpoints.load_state_dict(checkpoint)
    if t.progress.epoch_loader_state is not None:
        t.loaders[0].generator.set_state(t.progress.epoch_loader_state)
    t.progress.gflops_per_image = training_gflops_per_image(t.model)


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
    outcome = t.parts.step(x, y, progress.step + 1, check_loss=None if deferred else check_loss,
                           forward=progress.forward)
    if deferred:         # copies: a graph's next replay overwrites its output buffers
        measured = [outcome.loss.detach().float().clone(), (outcome.logits.argmax(dim=1) == y).float().mean()]
    progress.train_gflops += progress.gflops_per_image * x.shape[0] * distributed.world_size()
    if outcome.skipped:
        progress.skipped_steps += 1
        return measured[0], measured[1], False
    progress.step += 1
    t.scheduler.step_update(progress.step)          # no controller reads the LR: after its update is the same
    if outcome.changed is not None:
        progress.update_seconds += outcome.update_seconds
        if not get_method(t.run.method).full_width:
            progress.gflops_per_image = training_gflops_per_image(t.model)  # the tensors changed size
            progress.forward = parallel.wrap(t.model, t.device)      # DDP's buckets hold the old tensors
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
             "lr": t.optimizer.param_groups[0]["lr"], "elapsed_s": time.perf_counter() - p.started}
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
    train_time = time.perf_counter() - t.progress.started
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
        "wall_time_s": time.perf_counter() - t.progress.started, "train_time_s": train_time,
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
    with run_folder.holding(out) as out:
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
            t.progress.diverged = divergence_record(diverged)
            run_folder.write_checkpoint(out / "last.pt", t.checkpoint())
            raise
        return finalize(t, out)
