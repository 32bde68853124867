"""Fine-tuning: a run that starts from a trained dense model (``RunConfig.init``).

The dense model is a ``--method dense`` run's checkpoint (``best.pt``, ``last.pt`` or an
exported file) of the same architecture as the run's ``--model``, or, for a stock timm ViT
(``--model timm:ARCH``), a timm checkpoint file (a state dict in ``.pth``, ``.bin`` or
``.safetensors``, as timm's ``load_state_dict`` reads it). A timm file goes through what
timm does when it loads pretrained weights into a model of other sizes: the patch
embedding is summed or repeated over input channels (``adapt_input_conv``), the patch
embedding and position embedding are resampled to the run's patch and image size (the
architecture module's ``checkpoint_filter_fn``), and the classifier is dropped when its
shape differs from the run's. Every method starts from its weights:

* dense: the weights as they are;
* the compact methods (static, BARTER and its ablations, oneshot): the dense model cut to
  the density's budgets (:func:`~barter_mini.core.dense_start.cut_to_density`): each layer
  keeps its most important units on calibration batches of the run's training data, at
  the run's starting allocation (even, piled, given) or, for ``oneshot``, at the global
  allocation by importance;
* the masked methods: full width, their initial masks keep the largest-magnitude weights
  (:class:`~barter_mini.masked.base.MaskedDST`, ``init_from_weights``).

When the run's labels differ from the checkpoint's (another dataset, other classes, or
another class count), the classifier is re-initialised (``model.head``, as in timm's
``reset_classifier``) and the run says so. A timm file does not record its labels: its
classifier is kept when its class count equals the run's (timm's own rule for pretrained
weights).

A file that cannot start the run is one line naming it, before any weight is loaded: a
damaged, foreign or unsafe file, a zip that would inflate far beyond its size or a
safetensors header longer than the file (:mod:`~barter_mini.training.checkpoints`), and
weights whose names, shapes or dtypes are not the model's (the first tensor that differs,
:func:`~barter_mini.training.checkpoint_contents.check_weights`, where PyTorch's message is a line
per tensor).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from timm.models import load_state_dict as load_timm_state_dict
from timm.models._manipulate import adapt_input_conv
from torch import nn
from torch.utils.data import DataLoader

from ..core.budgets import Allocation, full_allocation
from ..core.configs import ModelConfig
from ..core.dense_start import CALIBRATION_BATCHES, cut_to_density
from ..core.models import build_model
from ..errors import BarterError
from .checkpoint_contents import BUILD_ERRORS, check_model_entries, check_weights
from .checkpoints import (DAMAGED_FILE_ERRORS, MODEL_KEYS, RefusedFileError, check_checkpoint, check_inflation,
                          check_safetensors_header, load_checkpoint, load_plain, quiet_loading)
from .data import DataSplits

#: the model's classifier, re-initialised when the class count changes (timm's name too)
CLASSIFIER = "head"
#: what a checkpoint is read for here (its error messages)
FINE_TUNING = "fine-tuning from it (--init)"
#: the name timm's loader reads as safetensors (anything else with torch.load)
SAFETENSORS_SUFFIX = ".safetensors"


def load_dense_weights(path: str | Path, config: ModelConfig, dataset: str | None = None,
                       classes=None, state: dict | None = None) -> tuple[dict, bool]:
    """The state dict of the dense checkpoint at ``path`` for a model of ``config`` trained on
    ``dataset`` (its ``classes``), and whether its classifier had to be left out (other
    labels); ``state`` is the checkpoint when it was already read from ``path``. A checkpoint
    of another architecture, input size or a compact one gets a one-line error."""
    state = state if state is not None else load_checkpoint(Path(path), keys=MODEL_KEYS, use=FINE_TUNING)
    saved, allocation = check_model_entries(state, Path(path))
    if allocation != full_allocation(saved):
        method = state["run"].get("method") if isinstance(state.get("run"), dict) else None
        raise BarterError(f"{path} holds a compact model ({method if isinstance(method, str) else 'not dense'}): "
                          "fine-tuning starts from a dense (full-width) checkpoint, e.g. a --method dense run")
    ours = {k: v for k, v in vars(config).items() if k not in ("name", "num_classes", "default_dataset")}
    theirs = {k: v for k, v in vars(saved).items() if k not in ("name", "num_classes", "default_dataset")}
    if ours != theirs:
        differ = sorted(k for k in ours if ours[k] != theirs.get(k))
        raise BarterError(f"{path} holds a {saved.name} model that differs from {config.name} on this dataset in "
                          f"{', '.join(differ)}: fine-tune it with the same --model and image size")
    weights = state["model"]
    labels = state["run"] if isinstance(state.get("run"), dict) else {}
    saved_classes = labels.get("classes")
    if not (saved_classes is None or isinstance(saved_classes, (list, tuple))):
        raise BarterError(f"{path}: run.classes must be None or a list of class numbers, got {saved_classes!r}: "
                          "the file is damaged or not barter-mini's")
    same_labels = dataset is None or "dataset" not in labels or (
        labels["dataset"] == dataset and _classes(saved_classes) == _classes(classes))
    reinitialised = saved.num_classes != config.num_classes or not same_labels
    if reinitialised:
        weights = {k: v for k, v in weights.items() if not k.startswith(CLASSIFIER + ".")}
    return weights, reinitialised


def package_checkpoint_or_none(path: str | Path) -> dict | None:
    """The checkpoint at ``path`` if this package wrote it, else None (it may be a timm file).
    Both are read by restricted unpicklers: a file that would run code, or a zip that would
    inflate far beyond its size, is refused here. A ``.safetensors`` file is timm's."""
    if str(path).endswith(SAFETENSORS_SUFFIX):
        return None
    try:
        contents = load_plain(Path(path), mmap=True)     # the tensors are read only if they are used
    except RefusedFileError:
        raise
    except BarterError:                 # not a torch.save zip (the legacy format): timm's loader reads it
        return None
    if isinstance(contents, dict) and "format" in contents:
        return check_checkpoint(contents, Path(path), keys=MODEL_KEYS, use=FINE_TUNING)
    return None                         # a state dict or a training script's checkpoint: timm's


def classifier_names(model: nn.Module) -> tuple[str, ...]:
    """The classifier modules timm's pretrained config names (``head``, DeiT's ``head_dist``)."""
    names = getattr(model, "pretrained_cfg", {}).get("classifier", CLASSIFIER)
    return (names,) if isinstance(names, str) else tuple(names)


def load_timm_weights(path: str | Path, model: nn.Module) -> tuple[dict, bool]:
    """The weights of a timm checkpoint file fitted to the full-width timm ``model`` (module
    docstring), and whether its classifier was left out. The file's sizes are checked before
    timm reads it (:func:`~barter_mini.training.checkpoints.check_safetensors_header`,
    :func:`~barter_mini.training.checkpoints.check_inflation`); whatever reading or fitting
    a damaged file ends in is one line naming it."""
    path = Path(path)
    if str(path).endswith(SAFETENSORS_SUFFIX):
        check_safetensors_header(path)
        kind = "safetensors file"
    else:
        check_inflation(path)
        kind = "timm checkpoint file"
    try:
        # weights_only: timm's default since 1.0.16, not in the 1.0.15 this package allows
        with quiet_loading():
            state = load_timm_state_dict(str(path), weights_only=True)
    except (*DAMAGED_FILE_ERRORS, SafetensorError) as error:
        if kind == "safetensors file":  # safetensors' messages are one line and say what is wrong
            first = str(error).strip().splitlines()[0][:120] if str(error).strip() else ""
            raise BarterError(f"{path} is not a readable safetensors file ({type(error).__name__}"
                              f"{': ' + first if first else ''}): give a file safetensors wrote") from None
        load_plain(path)                # the one-line refusal of a file that would run code, or a damaged one
        raise BarterError(f"{path} is neither a barter-mini checkpoint nor a readable {kind} "
                          f"({type(error).__name__}): give a state dict saved by torch.save or safetensors") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()):
        raise BarterError(f"{path} is no state dict (named tensors): give a state dict saved by torch.save or "
                          "safetensors")
    try:
        patch = state.get("patch_embed.proj.weight")
        in_chans = model.patch_embed.proj.in_channels
        if patch is not None and patch.dim() == 4 and patch.shape[1] != in_chans:
            state["patch_embed.proj.weight"] = adapt_input_conv(in_chans, patch)
        fit = getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None)
        if fit is not None:
            state = fit(state, model)
    except BUILD_ERRORS as error:       # timm's resampling of embeddings of other dimensions than a ViT's
        first = str(error).strip().splitlines()[0][:120] if str(error).strip() else ""
        raise BarterError(f"{path} does not fit {type(model).__name__}: timm cannot fit its embeddings "
                          f"({type(error).__name__}{': ' + first if first else ''})") from None
    ours = model.state_dict()
    heads = tuple(name + "." for name in classifier_names(model))
    classifier = [k for k in state if k.startswith(heads)]
    misfit = any(k not in ours or ours[k].shape != state[k].shape for k in classifier)
    if misfit:
        state = {k: v for k, v in state.items() if k not in classifier}
    return state, misfit


def _classes(classes):
    return None if classes is None else tuple(classes)


def calibration_loader(splits: DataSplits, batch_size: int, seed: int) -> DataLoader:
    """Shuffled training batches of their own seeded order, for the cut's importance."""
    return DataLoader(splits.train, batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(int(seed)))


def dense_start(path: str | Path, config: ModelConfig, dataset: str, classes, density: float, compact: bool,
                allocation: str | Allocation, splits: DataSplits, batch_size: int, seed: int,
                device: torch.device, drop_path: float = 0.0) -> tuple[nn.Module, bool]:
    """The run's starting model from the dense checkpoint at ``path`` (module docstring);
    and whether its classifier was re-initialised."""
    model = build_model(config, 1.0, drop_path=drop_path)       # a fresh classifier, seeded
    state = package_checkpoint_or_none(path) if config.timm_model else None
    if config.timm_model and state is None:
        weights, reinitialised = load_timm_weights(path, model)
    else:
        weights, reinitialised = load_dense_weights(path, config, dataset, classes, state)
    heads = tuple(name + "." for name in classifier_names(model))
    check_weights(model.state_dict(), weights, Path(path), optional=heads)   # a left-out classifier stays fresh
    model.load_state_dict(weights, strict=False)
    model = model.to(device)
    if compact:
        batches = calibration_loader(splits, batch_size, seed)
        cut_to_density(model, density, batches, allocation, max_batches=CALIBRATION_BATCHES)
    return model, reinitialised
