"""Training: AdamW with warm-up and cosine LR, label smoothing, the method's controller, metrics.

:func:`train` is three steps: :func:`build_training` (data, model, optimizer, LR schedule and
the controller the registry builds for the method), :func:`fit_one_epoch` (the loop, with the
controller's ``before_step`` / ``after_step`` around every optimizer step) and
:func:`finalize` (test the best checkpoint, write the metrics). A run folder holds ``best.pt`` (chosen on validation Top-1), ``last.pt`` and
``metrics.json``: validation and test Top-1 and macro-F1 (fractions, test measured with the
best checkpoint), wall time, transfers planned and executed, the per-epoch history and the
per-layer allocation after every topology update, a training curve (running loss and
accuracy every ``LOG_EVERY`` steps), the training losses around every update
(``update_losses``) and the time the updates took (``update_time_s``), and the cumulative
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
epochs: :func:`steps_for_compute` steps, over which the LR and update schedules are laid.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import f1_score
from timm.scheduler import CosineLRScheduler
from torch import nn
from torch.utils.data import Subset
from tqdm import tqdm

from ..version import __version__
from ..core import distributed
from ..core.budgets import Allocation, check_allocation, compute_budget, starting_allocation
from ..core.configs import ModelConfig
from ..core.compilation import graphs_compiled
from ..core.counting import count_parameters, training_gflops_per_image
from ..core.execution import Execution
from ..core.method import MethodController
from ..core.models import build_model, get_model_config
from ..core.surgery import allocation_of
from ..errors import BarterError, TrainingDiverged, TrainingInterrupted, check_integer
from .checkpoints import (CHECKPOINT_FORMAT, RUN_KEYS, check_can_create, load_checkpoint, model_from_checkpoint,
                          read_json, write_json)
from . import parallel, run_folder
from .data import DataSplits, load_dataset, make_loaders
from .finetune import dense_start
from .methods import MethodSetup, get_method
from .random_state import capture_generators, restore_generators
from .run_config import RunConfig
from .graphs import GraphedStep, check_graphs_possible
from .step import training_step
from .optimization import make_criterion, make_optimizer, resolve_device, resolve_recipe, seed_everything
from .recipes import Recipe

#: a run whose mean training loss over ``LOG_EVERY`` steps exceeds this many times the loss
#: of a uniform guess (``ln C``) has diverged (:func:`check_loss_against_chance`)
DIVERGED_LOSS_FACTOR = 20
#: optimizer steps per point of the training curve (running train loss and accuracy)
LOG_EVERY = 10
#: steps before and after every topology or mask update whose training losses metrics.json
#: keeps (``update_losses``): where a cold start would show as a loss spike
UPDATE_WINDOW = 10

#: what a run reports beside its progress bar (the command line shows INFO; a notebook nothing)
LOG = logging.getLogger(__name__)


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, execution: Execution = Execution()) -> dict[str, float]:
    """Top-1 accuracy and macro-F1 (fractions) of ``model`` on ``loader``, its forward pass in
    the run's precision."""
    model.eval()
    preds, labels = [torch.zeros(0, dtype=torch.long)], [torch.zeros(0, dtype=torch.long)]
    for x, y in loader:
        with execution.autocast(device):
            logits = model(x.to(device))
        preds.append(logits.argmax(dim=1).cpu())
        labels.append(y.cpu())
    pred, true = parallel.gather_predictions(torch.cat(preds), torch.cat(labels))   # this process's share
    pred, true = pred.numpy(), true.numpy()
    return {"acc": float((pred == true).mean()),
            "macro_f1": float(f1_score(true, pred, average="macro", zero_division=0))}


def progress(default):
    """A :class:`Training` field that last.pt keeps and a resumed run restores (``default``: a
    value, or a factory such as ``list``)."""
    if callable(default):
        return field(default_factory=default, metadata={"progress": True})
    return field(default=default, metadata={"progress": True})


def progress_fields(t: "Training") -> list:
    return [spec for spec in fields(t) if spec.metadata.get("progress")]


def _copy(value):
    return list(value) if isinstance(value, list) else value


@dataclass
class Training:
    """A run in progress: what :func:`build_training` sets up and :func:`fit_one_epoch` advances."""

    def __setattr__(self, name: str, value) -> None:
        if name == "controller" and "controller" in self.__dict__:
            raise BarterError("a run's controller is fixed when it is built: the graphed step and the "
                              "checkpoints hold it; wrap it through build_training(wrap_controller=...)")
        super().__setattr__(name, value)

    run: RunConfig
    recipe: Recipe
    config: ModelConfig
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: CosineLRScheduler
    controller: MethodController
    criterion: nn.Module
    loaders: tuple
    total_steps: int
    started: float
    #: training GFLOPs per image of the tensors as they are now (3 x forward; recomputed on resume)
    gflops_per_image: float = 0.0
    # the progress of the run: what last.pt keeps and a resumed run restores, field by field
    #: the cumulative training GFLOPs so far: each segment between topology updates at its own cost
    train_gflops: float = progress(0.0)
    #: wall seconds spent in the controller's after_step calls that changed the model
    update_seconds: float = progress(0.0)
    step: int = progress(0)
    #: batches whose fp16 gradients overflowed: trained on, but no optimizer step (not in ``step``)
    skipped_steps: int = progress(0)
    best_acc: float = progress(-1.0)
    history: list = progress(list)
    curve: list = progress(list)
    window: list = progress(list)
    #: the training loss of every step so far (for the windows around updates)
    step_losses: list = progress(list)
    #: the epoch in progress or next to start (1-based), the batches of it already trained,
    #: their losses, and the training loader's generator state at its start
    epoch: int = progress(1)
    batches_done: int = progress(0)
    epoch_losses: list = progress(list)
    epoch_loader_state: torch.Tensor | None = progress(None)
    #: the last completed epoch's validation scores
    last_val: dict | None = progress(None)
    #: what the training step calls: the model, or its DDP replica (training.parallel)
    forward: nn.Module | None = None
    #: how every step and evaluation executes (compile, recompute, precision)
    execution: Execution = field(default_factory=Execution)
    #: the step replayed from CUDA graphs (--cuda-graphs), else None
    graphed: GraphedStep | None = None
    #: the loss scaler of an fp16 run (Execution.grad_scaler), else None
    scaler: torch.amp.GradScaler | None = None
    #: Dynamo's graph count when the run started (--compile: the difference counts recompiles)
    graphs_at_start: int = 0
    #: why the run stopped for divergence (:func:`divergence_record`), else None: last.pt keeps
    #: it, so a resume of a diverged run stops with the same line instead of training on
    diverged: dict | None = None

    def checkpoint(self) -> dict:
        """The model and everything needed to continue exactly from here (:func:`resume_training`)."""
        return {"format": CHECKPOINT_FORMAT, "version": __version__, "run": asdict(self.run),
                "recipe": asdict(self.recipe), "model_config": asdict(self.config),
                "allocation": allocation_of(self.model).as_dict(), "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "controller": self.controller.state_dict(),
                "epoch": self.epoch - 1, "step": self.step, "val": self.last_val,
                "resume": self.resume_state(), "diverged": self.diverged}

    def resume_state(self) -> dict:
        """The trainer's side of an exact resume: every :func:`progress` field (position in the
        data, records), the length fixed when the run started, the LR schedule, every process's
        random generators (they draw different augmentations) and the elapsed time."""
        return {**{f.name: _copy(getattr(self, f.name)) for f in progress_fields(self)},
                "total_steps": self.total_steps, "epochs": self.recipe.epochs,
                "scheduler": self.scheduler.state_dict(), "rng": distributed.all_gather(capture_generators()),
                "scaler": None if self.scaler is None else self.scaler.state_dict(),
                "elapsed_s": time.perf_counter() - self.started}

    def load_resume_state(self, state: dict) -> None:
        """Restore :meth:`resume_state`'s progress fields and elapsed time (the rest:
        :func:`resume_training`)."""
        for spec in progress_fields(self):
            setattr(self, spec.name, _copy(state[spec.name]))
        self.started = time.perf_counter() - state["elapsed_s"]


def steps_for_compute(pflops: float, gflops_per_image: float, batch_size: int) -> int:
    """Optimizer steps whose training compute first reaches ``pflops``:
    ``ceil(pflops * 1e6 / (gflops_per_image * batch_size))``. A compact model's cost per
    image does not change when BARTER moves units (a head, or an FFN channel, costs the same
    in every layer), so the budget is met within one batch."""
    return max(1, math.ceil(pflops * 1e6 / (gflops_per_image * batch_size)))


def read_train_pflops(run_dir: str | Path) -> float:
    """The cumulative training PFLOPs a finished run recorded (``--match-compute``)."""
    path = Path(run_dir) / "metrics.json"
    if not path.is_file():
        raise BarterError(f"{run_dir} holds no metrics.json: match the compute of a finished run folder")
    metrics = read_json(path)
    if "train_pflops" not in metrics:
        raise BarterError(f"{path} records no train_pflops: retrain that run with this version")
    return float(metrics["train_pflops"])


def start_allocation(run: RunConfig, config: ModelConfig) -> Allocation:
    """Where a compact run starts: its ``start`` rule, or its given ``allocation``, which must
    hold exactly the density's budgets (core.budgets.compute_budget) within each layer's bounds."""
    budget = compute_budget(config, run.density)
    if run.allocation is None:
        return starting_allocation(config, budget, run.start)
    given = check_allocation(config, Allocation(heads=tuple(run.allocation["heads"]), ffn=tuple(run.allocation["ffn"])))
    if (sum(given.heads), sum(given.ffn)) != (budget.heads, budget.ffn):
        raise BarterError(f"the given allocation holds {sum(given.heads)} heads and {sum(given.ffn)} FFN channels; "
                          f"density {run.density:g} of {config.name} budgets {budget.heads} and {budget.ffn}")
    return given


def load_splits(run: RunConfig, recipe: Recipe) -> DataSplits:
    """The run's dataset, cut to the recipe's training and evaluation subsets."""
    splits = load_dataset(run.dataset, run.data_root, seed=run.seed, train_subset=recipe.train_subset,
                          download=run.download, classes=run.classes, img_size=run.img_size)
    if recipe.eval_subset:
        splits.val = Subset(splits.val, range(min(recipe.eval_subset, len(splits.val))))
        splits.test = Subset(splits.test, range(min(recipe.eval_subset, len(splits.test))))
    return splits


def build_run_model(run: RunConfig, config: ModelConfig, recipe: Recipe, splits: DataSplits, device: torch.device,
                    checkpoint: dict | None) -> nn.Module:
    """The run's model on ``device``: compact at the allocation it starts from (or the
    checkpoint's, whose values :func:`resume_training` loads), full-width for a masked method,
    or cut from the dense ``init`` checkpoint (:func:`~barter_mini.training.finetune.dense_start`)."""
    method = get_method(run.method)
    if checkpoint is not None:        # the tensors as they were; their values are loaded later
        allocation = None if method.full_width else Allocation(
            **{kind: tuple(widths) for kind, widths in checkpoint["allocation"].items()})
    else:
        allocation = None if method.full_width else start_allocation(run, config)
    if run.init is None or checkpoint is not None:
        return build_model(config, method.model_density(run.density), allocation, drop_path=recipe.drop_path).to(device)
    model, reinitialised = dense_start(
        run.init, config, run.dataset, run.classes, run.density, compact=not method.full_width,
        allocation="oneshot" if method.needs_init else allocation, splits=splits,
        batch_size=recipe.batch_size, seed=run.seed, device=device, drop_path=recipe.drop_path)
    if reinitialised:
        LOG.info("%s: the classifier was re-initialised for the %d classes of this run", run.init, config.num_classes)
    return model


def run_length(run: RunConfig, recipe: Recipe, steps_per_epoch: int, gflops_per_image: float,
               checkpoint: dict | None) -> tuple[int, Recipe]:
    """The run's optimizer steps and its recipe with the epochs they span: the recipe's
    epochs, or as many steps as a compute budget (``pflops``) buys; a resumed run keeps the
    length fixed when it started."""
    if checkpoint is not None:
        return checkpoint["resume"]["total_steps"], replace(recipe, epochs=checkpoint["resume"]["epochs"])
    if run.pflops is None:
        return recipe.epochs * steps_per_epoch, recipe
    total_steps = steps_for_compute(run.pflops, gflops_per_image, recipe.batch_size)
    return total_steps, replace(recipe, epochs=math.ceil(total_steps / steps_per_epoch))


def build_training(run: RunConfig, checkpoint: dict | None = None, wrap_controller=None) -> Training:
    """Data, model, optimizer, LR schedule and the method's controller of ``run``; from a
    ``last.pt`` ``checkpoint`` of the same run, everything as it was when it was written
    (:func:`resume_training`). ``wrap_controller(controller, model, recipe, loaders, device)``
    may wrap the method's controller (a probe of its updates) before anything holds it: a
    run's controller is fixed once built (:class:`Training` refuses another), so a graphed
    step and a checkpoint can never hold a different one from the run's."""
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
    optimizer = make_optimizer(model, recipe, capturable=run.cuda_graphs)
    gflops = training_gflops_per_image(model)
    total_steps, recipe = run_length(run, recipe, len(loaders[0]), gflops, checkpoint)
    scheduler = CosineLRScheduler(
        optimizer, t_initial=total_steps, lr_min=recipe.min_lr,
        warmup_t=int(recipe.warmup_fraction * total_steps), warmup_lr_init=recipe.lr * 0.01,
        warmup_prefix=True, t_in_epochs=False)
    execution = run.execution()
    controller = get_method(run.method).build(MethodSetup(model, optimizer, run.density, total_steps, recipe,
                                                          run.seed, from_trained=run.init is not None,
                                                          loss_scaled=execution.loss_scaling))
    if wrap_controller is not None:
        controller = wrap_controller(controller, model, recipe, loaders, device)
    t = Training(run, recipe, config, device, model, optimizer, scheduler, controller, make_criterion(recipe),
                 loaders, total_steps, started=time.perf_counter(), gflops_per_image=gflops,
                 execution=execution, scaler=execution.grad_scaler(device))
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
    t.execution.apply(t.model)
    if t.execution.graphs:
        check_graphs_possible(device, run.method, distributed.is_distributed())
        t.graphed = GraphedStep(t.model, optimizer, t.criterion, controller, t.execution)
    t.forward = parallel.wrap(t.model, device)
    return t


def resume_training(t: Training, checkpoint: dict) -> None:
    """Put a freshly built run (tensors already of the checkpoint's sizes) back where
    ``checkpoint`` left it: weights, optimizer moments (its parameter groups already point at
    this model's tensors), LR schedule, the controller's statistics, masks, RNGs and counts,
    the trainer's records, its position in the epoch and every random generator.

    The global RNGs are restored last: building the model drew from them."""
    state = checkpoint["resume"]
    t.model.load_state_dict(checkpoint["model"])
    t.optimizer.load_state_dict(checkpoint["optimizer"])
    t.scheduler.load_state_dict(state["scheduler"])
    t.controller.load_state_dict(checkpoint["controller"])
    if t.scaler is not None:
        t.scaler.load_state_dict(state["scaler"])
    t.load_resume_state(state)
    t.gflops_per_image = training_gflops_per_image(t.model)
    if t.epoch_loader_state is not None:     # the shuffle of the epoch the run continues in
        t.loaders[0].generator.set_state(t.epoch_loader_state)
    restore_generators(parallel.own_state(state["rng"], "random generators"))


def train_step(t: Training, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float, bool]:
    """One optimizer step of the run on ``(x, y)`` (:func:`~barter_mini.training.step.training_step`)
    and its bookkeeping: the LR schedule, the compute spent, the update's time and, after a
    topology update, the tensors' new cost and a new DDP wrapper. Returns the batch's loss and
    accuracy averaged over processes, and whether an optimizer step was taken (under fp16 a
    step whose gradients overflowed is not: it counts in ``skipped_steps``, not in ``step``).
    Loss and accuracy are read before backward: a non-finite loss stops the run
    (:class:`~barter_mini.errors.TrainingDiverged`) before its gradients reach the weights, the
    optimizer or the method's statistics, and the controller's ``before_step`` stops it before
    it decides on non-finite values."""
    measured: list[float] = []

    def check_loss(loss: torch.Tensor, logits: torch.Tensor) -> None:
        measured.extend(parallel.mean_over_processes(loss.item(), (logits.argmax(dim=1) == y).float().mean().item()))
        if not math.isfinite(measured[0]):
            raise TrainingDiverged(t.step + 1, f"the training loss is {measured[0]}")

    if t.graphed is not None:
        outcome = t.graphed(x, y, t.step + 1, check_loss)
    else:
        outcome = training_step(t.forward, t.optimizer, x, y, criterion=t.criterion, controller=t.controller,
                                step=t.step + 1, check_loss=check_loss, execution=t.execution, scaler=t.scaler)
    t.train_gflops += t.gflops_per_image * x.shape[0] * distributed.world_size()
    if outcome.skipped:
        t.skipped_steps += 1
        return measured[0], measured[1], False
    t.step += 1
    t.scheduler.step_update(t.step)          # no controller reads the LR: after its update is the same
    if outcome.changed is not None:
        t.update_seconds += outcome.update_seconds
        if not get_method(t.run.method).full_width:
            t.gflops_per_image = training_gflops_per_image(t.model)  # the tensors changed size
            t.forward = parallel.wrap(t.model, t.device)      # DDP's buckets hold the old tensors
    return measured[0], measured[1], True


def fit_one_epoch(t: Training, after_each_step=None) -> dict:
    """Train the rest of epoch ``t.epoch`` (all of it unless resumed inside it), the method's
    controller around every optimizer step and ``after_each_step(t)`` after it (checkpoints,
    interruptions); return the epoch's history entry (train loss, validation scores, LR,
    elapsed time) and move ``t`` to the next epoch."""
    t.model.train()
    loader, epoch = t.loaders[0], t.epoch
    if t.batches_done == 0:
        t.epoch_loader_state, t.epoch_losses = loader.generator.get_state(), []
    else:                             # resumed inside the epoch (resume_training set its shuffle)
        loader.batch_sampler.skip = t.batches_done       # its first batches passed over
    losses = t.epoch_losses
    bar = tqdm(loader, desc=f"{t.run.method} epoch {epoch}/{t.recipe.epochs}", initial=t.batches_done,
               disable=(None if t.run.progress is None else not t.run.progress), leave=False)
    for x, y in ([] if t.step >= t.total_steps else bar):
        x, y = x.to(t.device, non_blocking=True), y.to(t.device, non_blocking=True)
        loss_value, accuracy, stepped = train_step(t, x, y)
        losses.append(loss_value)
        if stepped:                           # step_losses and the curve are indexed by optimizer step
            t.step_losses.append(loss_value)
            t.window.append((loss_value, accuracy))
        if stepped and t.step % LOG_EVERY == 0:
            t.curve.append({"step": t.step, "train_loss": float(np.mean([l for l, _ in t.window])),
                            "train_acc": float(np.mean([a for _, a in t.window]))})
            t.window.clear()
            check_loss_against_chance(t.curve[-1]["train_loss"], t.step, t.config.num_classes)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        t.batches_done += 1
        if after_each_step is not None:
            after_each_step(t)
        if t.step >= t.total_steps:          # a compute budget can end inside an epoch
            break
    bar.close()
    val = evaluate(t.model, t.loaders[1], t.device, t.execution)
    entry = {"epoch": epoch, "step": t.step, "train_loss": float(np.mean(losses)),
             "val_acc": val["acc"], "val_macro_f1": val["macro_f1"],
             "lr": t.optimizer.param_groups[0]["lr"], "elapsed_s": time.perf_counter() - t.started}
    t.history.append(entry)
    t.last_val = {"acc": val["acc"], "macro_f1": val["macro_f1"]}
    t.epoch, t.batches_done, t.epoch_losses = epoch + 1, 0, []
    t.epoch_loader_state = loader.generator.get_state()        # where the next epoch's shuffle starts
    return entry


def check_loss_against_chance(mean_loss: float, step: int, num_classes: int, steps: int = LOG_EVERY) -> None:
    """Raise :class:`~barter_mini.errors.TrainingDiverged` if the mean training loss of the
    ``steps`` steps up to ``step`` exceeds :data:`DIVERGED_LOSS_FACTOR` times the loss of
    a uniform guess, ``ln C`` for ``C`` classes (whatever the label smoothing): a model that
    far worse than chance has diverged, though every number is still finite."""
    limit = DIVERGED_LOSS_FACTOR * math.log(max(num_classes, 2))
    if mean_loss > limit:
        raise TrainingDiverged(step, f"the training loss averaged {mean_loss:.4g} over steps {step - steps + 1}-{step}, "
                                     f"over {DIVERGED_LOSS_FACTOR} times that of a uniform guess "
                                     f"({limit:.3g} = {DIVERGED_LOSS_FACTOR} x ln {num_classes})")


def check_recent_losses(t: Training) -> None:
    """:func:`check_loss_against_chance` on the mean loss of the last ``LOG_EVERY`` optimizer
    steps (fewer in a run that has taken fewer): called before anything is written from the
    run's state, so a step whose loss the periodic check has not yet seen (a run shorter than
    ``LOG_EVERY`` steps, the end of an epoch between two curve points) never reaches a
    checkpoint or metrics.json unchecked. The losses were read on the host already (the
    step's finiteness check), so this costs no device synchronisation."""
    recent = t.step_losses[-LOG_EVERY:]
    if recent:
        check_loss_against_chance(float(np.mean(recent)), t.step, t.config.num_classes, len(recent))


def save_epoch(t: Training, out: Path) -> None:
    """``last.pt`` after every epoch, ``best.pt`` when validation Top-1 improved."""
    check_recent_losses(t)
    improved = t.last_val["acc"] > t.best_acc
    if improved:
        t.best_acc = t.last_val["acc"]
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


def finalize(t: Training, out: Path) -> dict:
    """Test the best checkpoint and write ``metrics.json``; return the metrics."""
    train_time = time.perf_counter() - t.started
    best = load_checkpoint(out / "best.pt", map_location=t.device, keys=RUN_KEYS, use="testing the best model")
    best_model = model_from_checkpoint(best, t.device, path=out / "best.pt")
    test = evaluate(best_model, t.loaders[2], t.device, t.execution)
    run = t.run
    metrics = {
        "version": __version__, "method": run.method, "model": run.model, "dataset": run.dataset,
        "density": run.density, "seed": run.seed, "recipe": t.recipe.name, "epochs": t.recipe.epochs,
        "device": t.device.type, "steps": t.step, "best_epoch": best["epoch"],
        "val_acc": best["val"]["acc"], "val_macro_f1": best["val"]["macro_f1"],
        "test_acc": test["acc"], "test_macro_f1": test["macro_f1"],
        "wall_time_s": time.perf_counter() - t.started, "train_time_s": train_time,
        "params": count_parameters(best_model),
        "train_gflops_per_image": training_gflops_per_image(best_model),
        "train_pflops": t.train_gflops / 1e6,
        "update_time_s": t.update_seconds, "update_ms_per_step": 1000 * t.update_seconds / max(1, t.step),
        "skipped_steps": t.skipped_steps,
        "allocation": best["allocation"], "history": t.history, "curve": t.curve,
        "update_losses": update_losses(t.step_losses, t.controller.changing_steps()),
        **t.controller.metrics(), "processes": distributed.world_size(), "threads": torch.get_num_threads(),
        "graphs_compiled": graphs_compiled() - t.graphs_at_start if run.compile else 0,
        **(t.graphed.metrics() if t.graphed is not None else {}),
        "run": asdict(run), "recipe_settings": asdict(t.recipe),
    }
    if distributed.is_main_process():
        write_json(out / "metrics.json", metrics)
    parallel.barrier()
    return metrics


def divergence_record(diverged: TrainingDiverged) -> dict:
    """What last.pt keeps of a divergence (:attr:`Training.diverged`): enough to raise it again."""
    return {"step": diverged.step, "what": diverged.what, "hint": diverged.hint}


def diverged_again(checkpoint: dict, path: Path) -> TrainingDiverged:
    """The divergence that stopped the run whose ``last.pt`` (at ``path``) is ``checkpoint``,
    to raise again on ``--resume``: the same line, the same exit status. A resumed diverged
    run would otherwise train on from a broken state until its loss happened to fall below
    the rule and end as if it had finished."""
    record = checkpoint["diverged"]
    if not (isinstance(record, dict) and isinstance(record.get("step"), int) and isinstance(record.get("what"), str)
            and isinstance(record.get("hint", ""), str) and isinstance(checkpoint.get("step"), int)):
        raise BarterError(f"{path} marks its run as diverged but does not say where (a damaged file): "
                          "train the run again in another --out")
    return TrainingDiverged(record["step"], record["what"], checkpoint=path, kept_step=checkpoint["step"],
                            hint=record.get("hint", ""))


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
                raise TrainingInterrupted(received[0] if received else signal.SIGTERM, t.step, out / "last.pt")
            if checkpoint_every is not None and t.step % checkpoint_every == 0:
                check_recent_losses(t)
                run_folder.write_checkpoint(out / "last.pt", t.checkpoint())

        try:
            while t.epoch <= t.recipe.epochs:
                fit_one_epoch(t, after_each_step)
                save_epoch(t, out)
        except TrainingDiverged as diverged:
            # the model, optimizer and records are those after the last step with finite
            # values: keep them (the cause can be studied, e.g. the weights' norms), say so,
            # and mark them diverged so that no resume trains on from them
            diverged.checkpoint, diverged.kept_step = out / "last.pt", t.step
            diverged.hint = (f"the learning rate {t.recipe.lr:g} may be too high: "
                             "try a smaller --lr, in another --out")
            t.diverged = divergence_record(diverged)
            run_folder.write_checkpoint(out / "last.pt", t.checkpoint())
            raise
        return finalize(t, out)
