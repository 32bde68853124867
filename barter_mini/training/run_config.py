"""The settings of a training run: one dataclass, the one place a setting is declared.

Each field of :class:`RunConfig` carries what the command line needs to offer it as a flag
(:func:`setting`: its help text, its kind of value, a flag name where it is not the field's),
so ``barter-mini train`` builds its flags from the fields (``cli.arguments.add_run_settings``) and its
run from the parsed flags; :meth:`RunConfig.validate` checks every value before any work.
Adding a setting is one field here (and its use where it acts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from ..core.budgets import STARTS, check_density, compute_budget
from ..core.configs import MODEL_CONFIGS
from ..core.execution import PRECISIONS, Execution
from ..core.models import get_model_config, model_family
from ..core.models.timm_vit import TIMM_PREFIX
from ..errors import BarterError, check_in_range, check_integer, check_seed, choose
from .data import DATASETS
from .methods import get_method, METHODS
from .recipes import RECIPE_NAMES, get_recipe

#: the kinds of value a setting's flag parses (the command line maps each to its parser)
KINDS = ("str", "int", "float", "positive_int", "density", "classes", "bool")


#: what a recipe setting of :class:`RunConfig` changes (``setting(recipe=...)``): the
#: :class:`~barter_mini.training.recipes.Recipe` itself or its BARTER settings
RECIPE_TARGETS = ("recipe", "barter")


def setting(default: Any, help: str | Callable[[], str] = "", *, kind: str | None = None, flag: str | None = None,
            metavar: str | None = None, cli: bool = True, recipe: str | None = None):
    """A :class:`RunConfig` field: ``default`` (a callable: a factory), and for its command-line
    flag the ``help`` (text, or a function giving it from the registries), the ``kind`` of
    value (:data:`KINDS`; default: bool for a bool default, else str), the ``flag`` (default
    ``--field-name``; a bool field's flag sets it, ``--no-...`` clears it) and ``metavar``;
    ``cli`` False: no flag (settings given from Python or notebooks only); ``recipe``: the
    settings (one of :data:`RECIPE_TARGETS`) whose setting of the same name this field
    overrides when set (:func:`recipe_settings`)."""
    kind = kind or ("bool" if isinstance(default, bool) or flag and flag.startswith("--no-") else "str")
    if kind not in KINDS:
        raise ValueError(f"a setting's kind is one of {', '.join(KINDS)}, not {kind!r}")
    if recipe is not None and recipe not in RECIPE_TARGETS:
        raise ValueError(f"a setting's recipe target is one of {', '.join(RECIPE_TARGETS)}, not {recipe!r}")
    metadata = {"help": help, "kind": kind, "flag": flag, "metavar": metavar, "cli": cli, "recipe": recipe}
    if callable(default):
        return field(default_factory=default, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class RunConfig:
    """Everything that determines a training run (and its cache key in later tools)."""

    method: str = setting("barter", lambda: f"one of {', '.join(METHODS)}")
    model: str = setting("cct-mini", lambda: f"one of {', '.join(MODEL_CONFIGS)}, or {TIMM_PREFIX}ARCH[:key=value,...] "
                                             "(a stock timm ViT)")
    dataset: str = setting("fashion-mnist", lambda: ", ".join(DATASETS))
    density: float = setting(0.3, "fraction of heads and FFN channels kept (dense: 1)", kind="density")
    seed: int = setting(0, "random seed (model init, data split and order, updates)", kind="int")
    recipe: str = setting("quick", lambda: f"one of {', '.join(RECIPE_NAMES)}")
    epochs: int | None = setting(None, "epochs (default: the recipe's)", kind="positive_int", recipe="recipe")
    batch_size: int | None = setting(None, "batch size (default: the recipe's)", kind="positive_int", recipe="recipe")
    lr: float | None = setting(None, "peak learning rate (default: the recipe's)", kind="float", recipe="recipe")
    train_subset: int | None = setting(None, "train on the first N shuffled training images", kind="positive_int",
                                     recipe="recipe")
    eval_subset: int | None = setting(None, "evaluate on the first N validation and test images", kind="positive_int",
                                      recipe="recipe")
    transfer_multiplier: float | None = setting(None, "scale the planned transfers (Table 16)", kind="float",
                                             recipe="barter")
    delta_t: int | None = setting(None, "optimizer steps between topology updates", kind="positive_int",
                                  recipe="barter")
    #: where a compact model starts (core.budgets.STARTS): even, or piled into the first or last layers
    start: str = setting("even", "initial allocation of a compact method: even, first or last (piled into those layers)")
    #: or an explicit starting allocation ``{"heads": [...], "ffn": [...]}`` with the density's budgets
    allocation: dict | None = setting(None, cli=False)
    #: fine-tune from this dense checkpoint (training.finetune), else train from scratch
    init: str | None = setting(None, "fine-tune from a dense checkpoint: best.pt or last.pt of a --method dense run, "
                                     "or a timm checkpoint file (.pth, .bin, .safetensors) of --model timm:ARCH",
                               metavar="CHECKPOINT")
    #: train until the cumulative training compute reaches this many PFLOPs (compute-matched,
    #: Table 11) instead of for the recipe's epochs; the LR and update schedules span those steps
    pflops: float | None = setting(None, "train until this many cumulative training PFLOPs instead of --epochs "
                                         "(compute-matched)", kind="float")
    #: train and evaluate on these classes of the dataset only, relabelled 0..k-1 (data.select_classes)
    classes: tuple[int, ...] | None = setting(None, "train on these classes only, relabelled 0..k-1: e.g. 0-4 "
                                                    "(pretraining) or 5-9 (transfer)", kind="classes")
    #: resize the dataset's images to this many pixels a side (fine-tuning at a checkpoint's size)
    img_size: int | None = setting(None, "resize the images to this side, e.g. 64 to fine-tune a Tiny-ImageNet "
                                         "model on CIFAR-100", kind="positive_int")
    data_root: str | None = setting(None, "dataset folder (default: $BARTER_MINI_DATA or ./data)")
    download: bool = setting(False, "let torchvision download a missing dataset")
    device: str = setting("auto", "auto (CUDA when present), cpu or cuda")
    #: the encoder layers through torch.compile with dynamic shapes (core.compilation)
    compile: bool = setting(False, "run the encoder layers through torch.compile, with shapes that survive "
                                   "topology updates")
    #: LayerNorm and GELU outputs recomputed in backward instead of saved (core.recompute)
    recompute: bool = setting(False, "recompute LayerNorm and GELU outputs in backward instead of saving them "
                                     "(less memory)")
    #: the forward pass and the loss under torch.autocast to bf16 or fp16 (core.execution)
    precision: str = setting("fp32", lambda: f"one of {', '.join(PRECISIONS)}: the forward pass and loss in that "
                                             "precision (weights, gradients and optimizer states stay fp32; "
                                             "fp16, for GPUs without bf16, scales the loss)")
    #: the whole step recorded as one CUDA graph, recorded anew after each update (training.graphs)
    cuda_graphs: bool = setting(False, "replay each training step from a recorded CUDA graph, recorded anew after "
                                       "every topology update (CUDA only)")
    #: a progress bar (None: tqdm's choice, on a terminal); the flag turns it off
    progress: bool | None = setting(None, "no progress bar", flag="--no-progress")
    #: the method's own settings, whole and typed (the registry row's ``settings`` type:
    #: :class:`~barter_mini.core.barter.BarterSettings` for BARTER and its variants,
    #: :class:`~barter_mini.masked.base.MaskedSettings` for the masked baselines), in place of the
    #: recipe's; None: the recipe's. Built with :meth:`with_method_settings`.
    method_settings: Any = setting(None, cli=False)

    def __post_init__(self) -> None:
        if isinstance(self.method_settings, dict):         # read back from a run's JSON record
            self.method_settings = _settings_from_record(self.method, self.method_settings)

    def with_method_settings(self, **changes) -> "RunConfig":
        """This run with its method's settings (the recipe's, or those it has) changed in the
        fields ``changes`` names: a one-line error for a method without settings or a field
        its settings lack."""
        settings_type = get_method(self.method).settings
        if settings_type is None:
            raise BarterError(f"{self.method} has no settings to change")
        unknown = sorted(set(changes) - {spec.name for spec in fields(settings_type)})
        if unknown:
            raise BarterError(f"{settings_type.__name__} has no setting {', '.join(unknown)}: it has "
                              f"{', '.join(spec.name for spec in fields(settings_type))}")
        current = self.method_settings or self._recipe().method_settings(settings_type)
        return replace(self, method_settings=replace(current, **changes))

    def _recipe(self):
        """The named recipe of this run's model family, before the run changes anything in it."""
        return get_recipe(self.recipe, model_family(self.model))

    def method_settings_changes(self) -> dict:
        """The fields in which this run's method settings differ from its recipe's (``{}``
        where it has none of its own): what :meth:`with_method_settings` changed."""
        if self.method_settings is None:
            return {}
        base = self._recipe().method_settings(type(self.method_settings))
        return {spec.name: getattr(self.method_settings, spec.name) for spec in fields(self.method_settings)
                if getattr(self.method_settings, spec.name) != getattr(base, spec.name)}

    def validate(self) -> "RunConfig":
        """A checked, normalised copy: the density a method always trains at (dense: 1) applied.

        Every value is checked here, before any data is loaded or any step is taken, so a bad
        one is a one-line error at once rather than after minutes of work."""
        method = get_method(self.method)
        config = get_model_config(self.model)
        check_density(self.density)          # even where the method overrides it: nan is never meant
        density = check_density(method.fixed_density or self.density)
        if not method.full_width:
            compute_budget(config, density)  # refuses a density too small to keep a head per layer
        choose("dataset", self.dataset, DATASETS)
        choose("recipe", self.recipe, RECIPE_NAMES)
        check_seed("seed", self.seed)
        choose("start", self.start, STARTS)
        if (self.start != "even" or self.allocation is not None) and method.full_width:
            what = f"start {self.start!r}" if self.start != "even" else "a given allocation"
            raise BarterError(f"{what} needs a compact method: {self.method} trains full-width "
                              "tensors, so only start 'even' applies")
        if self.allocation is not None and self.start != "even":
            raise BarterError(f"give either start {self.start!r} or an allocation, not both")
        if method.needs_init and self.init is None:
            raise BarterError(f"{self.method} allocates by the importance of a trained dense model: "
                              "give it one with --init CHECKPOINT")
        if method.needs_init and (self.start != "even" or self.allocation is not None):
            raise BarterError(f"{self.method} chooses its own allocation: leave start and allocation unset")
        if self.init is not None and not Path(self.init).is_file():
            raise BarterError(f"--init {self.init}: no such file; give a dense run's best.pt or last.pt "
                              "(or a timm checkpoint file with --model timm:ARCH)")
        for name in ("epochs", "batch_size", "train_subset", "delta_t"):
            if getattr(self, name) is not None:
                check_integer(name, getattr(self, name))
        if self.lr is not None:
            check_in_range("lr", self.lr, 0.0, math.inf, low_open=True)
        if self.transfer_multiplier is not None:
            check_in_range("transfer_multiplier", self.transfer_multiplier, 0.0, math.inf, low_open=True)
        if self.img_size is not None:
            # larger images outgrow memory in the first forward pass (attention over every patch)
            check_integer("img_size", self.img_size, maximum=512)
        if self.classes is not None and (
                not isinstance(self.classes, (list, tuple)) or len(set(self.classes)) < 2
                or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in self.classes)):
            raise BarterError(f"classes must be at least two distinct class indices >= 0, got {self.classes!r}")
        if self.data_root is not None:
            try:
                not_a_folder = Path(self.data_root).exists() and not Path(self.data_root).is_dir()
            except OSError as error:     # a parent folder we may not enter, a name too long
                raise BarterError(f"cannot use {self.data_root} as the data root: "
                                  f"{error.strerror or type(error).__name__}") from None
            if not_a_folder:
                raise BarterError(f"data root {self.data_root} is a file: give the folder that holds the datasets")
        if self.pflops is not None:
            check_in_range("pflops", self.pflops, 0.0, math.inf, low_open=True)
            if self.epochs is not None:
                raise BarterError("give either epochs or a PFLOPs budget (--pflops, --match-compute), not both")
        if self.eval_subset is not None:
            check_integer("eval_subset", self.eval_subset)
        if self.method_settings is not None:
            settings_type = method.settings
            if settings_type is None or not isinstance(self.method_settings, settings_type):
                raise BarterError(f"method_settings of {self.method} must be "
                                  f"{settings_type.__name__ if settings_type else 'None'}, "
                                  f"got {type(self.method_settings).__name__}")
            self.method_settings.validate()
        if self.device not in ("auto", "cpu", "cuda"):
            raise BarterError(f"device must be auto, cpu or cuda, got {self.device!r}")
        for name in ("compile", "recompute", "cuda_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise BarterError(f"{name} must be true or false, got {getattr(self, name)!r}")
        self.execution()                     # refuses compile with recompute or graphs, an unknown precision
        if self.cuda_graphs and self.device == "cpu":
            raise BarterError("--cuda-graphs needs a CUDA device; this run asks for the cpu: leave it off")
        return replace(self, density=density)


    def execution(self) -> Execution:
        """How the run's steps execute (``compile``, ``recompute``, ``precision``, ``cuda_graphs``)."""
        return Execution(self.compile, self.recompute, self.precision, self.cuda_graphs)


def recipe_settings(target: str | None = None) -> tuple[str, ...]:
    """The :class:`RunConfig` fields that override the recipe setting of the same name when
    set (``recipe=`` in :func:`setting`; only those of ``target``, one of
    :data:`RECIPE_TARGETS`, where given), in field order."""
    return tuple(spec.name for spec in fields(RunConfig)
                 if spec.metadata.get("recipe") and target in (None, spec.metadata["recipe"]))


def _settings_from_record(method: str, record: dict):
    """A run's method settings from their JSON record (a dict of their fields), typed by the
    method's registry row; a one-line error where they do not fit it."""
    settings_type = get_method(method).settings
    try:
        settings = settings_type(**{key: tuple(value) if isinstance(value, list) else value
                                    for key, value in record.items()})
    except TypeError as error:
        raise BarterError(f"the recorded method settings of {method} do not fit "
                          f"{getattr(settings_type, '__name__', 'a method without settings')}: {error}") from None
    return settings
