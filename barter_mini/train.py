"""Training: AdamW with warm-up and cosine LR, label smoothing, BARTER updates, metrics.

A run folder holds ``best.pt`` (chosen on validation Top-1), ``last.pt`` and
``metrics.json``: validation and test Top-1 and macro-F1 (fractions, test measured with the
best checkpoint), wall time, transfers planned and executed, the per-epoch history and the
per-layer allocation after every topology update, and a training curve (running loss and
accuracy every ``LOG_EVERY`` steps). All files are written atomically.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import f1_score
from timm.scheduler import CosineLRScheduler
from torch import nn
from torch.utils.data import Subset
from tqdm import tqdm

from . import __version__
from .barter import BarterController, BarterSettings
from .budgets import Allocation, check_density
from .configs import ModelConfig, get_model_config
from .data import load_dataset, make_loaders
from .errors import BarterError, choose
from .io import load_checkpoint, save_checkpoint, write_json
from .masked import MASKED_METHODS, MaskedSettings
from .measure import count_parameters, training_gflops_per_image
from .models import CompactTransformer, build_model
from .recipes import Recipe, get_recipe, with_overrides

#: BARTER and its Table 12 ablations (options of BARTER, not copies): settings overrides
BARTER_VARIANTS: dict[str, dict] = {
    "barter": {},
    "random-receiver": {"random_receiver": True},
    "random-donor": {"random_donor": True},
    "random-pair": {"random_receiver": True, "random_donor": True},
}
#: every method name: dense (full width, no updates), static (the budgeted compact model,
#: topology frozen), BARTER and its ablations, and the full-tensor masked baselines
METHODS: tuple[str, ...] = ("dense", "static", *BARTER_VARIANTS, *MASKED_METHODS)


def trains_full_width(method: str) -> bool:
    """Dense and the masked baselines keep full-size tensors; the rest are compact."""
    return method == "dense" or method in MASKED_METHODS


#: optimizer steps per point of the training curve (running train loss and accuracy)
LOG_EVERY = 10


@dataclass
class RunConfig:
    """Everything that determines a training run (and its cache key in later tools)."""

    method: str = "barter"
    model: str = "cct-mini"
    dataset: str = "fashion-mnist"
    density: float = 0.3
    seed: int = 0
    recipe: str = "quick"
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    train_subset: int | None = None
    transfer_multiplier: float | None = None
    delta_t: int | None = None
    data_root: str | None = None
    download: bool = False
    device: str = "auto"
    progress: bool | None = None
    overrides: dict = field(default_factory=dict)

    def validate(self) -> "RunConfig":
        choose("method", self.method, METHODS)
        get_model_config(self.model)
        if self.method == "dense":
            self.density = 1.0
        check_density(self.density)
        if self.epochs is not None and self.epochs < 1:
            raise BarterError(f"epochs must be a positive integer, got {self.epochs}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise BarterError(f"device must be auto, cpu or cuda, got {self.device!r}")
        return self


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise BarterError("device cuda requested but no CUDA device is available: use --device cpu or auto")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only: biases, norms and embeddings (1-D or positional) are not decayed."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim <= 1 or name.endswith(("pos_embed", "cls_token")) else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device) -> dict[str, float]:
    """Top-1 accuracy and macro-F1 (fractions) of ``model`` on ``loader``."""
    model.eval()
    preds, labels = [], []
    for x, y in loader:
        preds.append(model(x.to(device)).argmax(dim=1).cpu())
        labels.append(y)
    pred, true = torch.cat(preds).numpy(), torch.cat(labels).numpy()
    return {"acc": float((pred == true).mean()),
            "macro_f1": float(f1_score(true, pred, average="macro", zero_division=0))}


def model_from_checkpoint(checkpoint: dict, device: torch.device | str = "cpu") -> CompactTransformer:
    """Rebuild the compact model a checkpoint was saved from (its per-layer allocation)."""
    config = ModelConfig(**checkpoint["model_config"])
    allocation = Allocation(**{k: tuple(v) for k, v in checkpoint["allocation"].items()})
    model = build_model(config, allocation=allocation)
    model.load_state_dict(checkpoint["model"])
    return model.to(device)


def make_controller(run: RunConfig, recipe: Recipe, model, optimizer, total_steps: int):
    """What changes the topology during training: BARTER's controller, a masked method, or None.

    Masked baselines use the recipe's update interval and horizon, so every dynamic method
    updates on the same schedule.
    """
    if run.method in BARTER_VARIANTS:
        settings = BarterSettings(**{**asdict(recipe.barter), **BARTER_VARIANTS[run.method]})
        return BarterController(model, optimizer, total_steps, settings, seed=run.seed)
    if run.method in MASKED_METHODS:
        settings = MaskedSettings(delta_t=recipe.barter.delta_t, t_end=recipe.barter.t_end)
        return MASKED_METHODS[run.method](model, optimizer, run.density, total_steps, settings,
                                          seed=run.seed)
    return None


def controller_metrics(method: str, controller) -> dict:
    """The metrics.json entries of a run's topology changes (zeros and empty for frozen ones)."""
    none = {"heads": 0, "ffn": 0}
    metrics = {"transfers_planned": none, "transfers_executed": none, "allocation_history": [],
               "mask": None}
    if method in BARTER_VARIANTS:
        metrics.update(transfers_planned=controller.schedule.planned_totals(),
                       transfers_executed=dict(controller.executed),
                       allocation_history=controller.history)
    elif method in MASKED_METHODS:
        metrics["mask"] = {**controller.summary(), "history": controller.history}
    return metrics


def train(run: RunConfig, out: str | Path) -> dict:
    """Train one run into the folder ``out`` and return its metrics (also in metrics.json)."""
    run.validate()
    out = Path(out)
    device = resolve_device(run.device)
    seed_everything(run.seed)
    base_config = get_model_config(run.model)
    recipe: Recipe = with_overrides(
        get_recipe(run.recipe, base_config.family), epochs=run.epochs, batch_size=run.batch_size,
        lr=run.lr, train_subset=run.train_subset, transfer_multiplier=run.transfer_multiplier,
        delta_t=run.delta_t, **run.overrides)
    splits = load_dataset(run.dataset, run.data_root, seed=run.seed,
                          train_subset=recipe.train_subset, download=run.download)
    if recipe.eval_subset:
        splits.val = Subset(splits.val, range(min(recipe.eval_subset, len(splits.val))))
        splits.test = Subset(splits.test, range(min(recipe.eval_subset, len(splits.test))))
    train_loader, val_loader, test_loader = make_loaders(splits, recipe.batch_size, run.seed)
    info = splits.info
    config = base_config.for_data(info.img_size, info.in_chans, info.num_classes)

    model = build_model(config, 1.0 if trains_full_width(run.method) else run.density,
                        drop_path=recipe.drop_path).to(device)
    optimizer = torch.optim.AdamW(parameter_groups(model, recipe.weight_decay), lr=recipe.lr)
    total_steps = recipe.epochs * len(train_loader)
    scheduler = CosineLRScheduler(
        optimizer, t_initial=total_steps, lr_min=recipe.min_lr,
        warmup_t=int(recipe.warmup_fraction * total_steps), warmup_lr_init=recipe.lr * 0.01,
        warmup_prefix=True, t_in_epochs=False)
    controller = make_controller(run, recipe, model, optimizer, total_steps)
    criterion = nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)

    def checkpoint(epoch: int, step: int, val: dict) -> dict:
        return {"format": 1, "version": __version__, "run": asdict(run), "recipe": asdict(recipe),
                "model_config": asdict(config), "allocation": model.allocation().as_dict(),
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "masks": controller.enforced_masks() if run.method in MASKED_METHODS else None,
                "epoch": epoch, "step": step, "val": val}

    started = time.perf_counter()
    history, curve, window, best_acc, step = [], [], [], -1.0, 0
    for epoch in range(1, recipe.epochs + 1):
        model.train()
        losses = []
        bar = tqdm(train_loader, desc=f"{run.method} epoch {epoch}/{recipe.epochs}",
                   disable=(None if run.progress is None else not run.progress), leave=False)
        for x, y in bar:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            logits = model(x)
            loss = criterion(logits, y)
            loss.backward()
            if controller is not None:
                controller.before_step()
            optimizer.step()
            step += 1
            scheduler.step_update(step)
            if controller is not None:
                controller.after_step(step)
            losses.append(loss.item())
            window.append((losses[-1], (logits.argmax(dim=1) == y).float().mean().item()))
            if step % LOG_EVERY == 0:
                curve.append({"step": step, "train_loss": float(np.mean([l for l, _ in window])),
                              "train_acc": float(np.mean([a for _, a in window]))})
                window.clear()
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
        val = evaluate(model, val_loader, device)
        history.append({"epoch": epoch, "step": step, "train_loss": float(np.mean(losses)),
                        "val_acc": val["acc"], "val_macro_f1": val["macro_f1"],
                        "lr": optimizer.param_groups[0]["lr"],
                        "elapsed_s": time.perf_counter() - started})
        state = checkpoint(epoch, step, val)
        if val["acc"] > best_acc:
            best_acc = val["acc"]
            save_checkpoint(out / "best.pt", state)
        save_checkpoint(out / "last.pt", state)
    train_time = time.perf_counter() - started

    best = load_checkpoint(out / "best.pt", map_location=device)
    best_model = model_from_checkpoint(best, device)
    test = evaluate(best_model, test_loader, device)
    metrics = {
        "version": __version__, "method": run.method, "model": run.model, "dataset": run.dataset,
        "density": run.density, "seed": run.seed, "recipe": recipe.name, "epochs": recipe.epochs,
        "device": device.type, "steps": step, "best_epoch": best["epoch"],
        "val_acc": best["val"]["acc"], "val_macro_f1": best["val"]["macro_f1"],
        "test_acc": test["acc"], "test_macro_f1": test["macro_f1"],
        "wall_time_s": time.perf_counter() - started, "train_time_s": train_time,
        "params": count_parameters(best_model),
        "train_gflops_per_image": training_gflops_per_image(best_model),
        "allocation": best["allocation"], "history": history, "curve": curve,
        **controller_metrics(run.method, controller),
        "run": asdict(run), "recipe_settings": asdict(recipe),
    }
    write_json(out / "metrics.json", metrics)
    return metrics
