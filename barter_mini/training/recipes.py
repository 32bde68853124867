"""Training recipes as data: the paper's (Table 5) and CPU-sized ones.

``paper`` resolves to the recipe of the model family (CCT: CIFAR-100, ViT: Tiny-ImageNet).
``quick`` is CPU-sized: a few epochs of a small model on a 2-core CPU in minutes, what the
book's quick and long profiles train on CIFAR-10 and ``barter-mini train`` on its default
Fashion-MNIST; ``smoke`` runs in seconds and exists for tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ..core.barter import BarterSettings
from ..masked import MaskedSettings
from ..errors import choose


@dataclass(frozen=True)
class Recipe:
    name: str
    epochs: int
    batch_size: int
    lr: float
    min_lr: float
    weight_decay: float
    warmup_fraction: float
    label_smoothing: float = 0.1
    drop_path: float = 0.0
    train_subset: int | None = None
    eval_subset: int | None = None   # evaluate on the first N validation / test images only
    barter: BarterSettings = field(default_factory=BarterSettings)
    #: the masked baselines' own knobs (their update interval and horizon are BARTER's)
    masked: MaskedSettings = field(default_factory=MaskedSettings)

    def _method_field(self, settings_type: type) -> str:
        """The field that holds a method's settings of ``settings_type`` (``barter`` or ``masked``)."""
        return next(spec.name for spec in fields(self) if isinstance(getattr(self, spec.name), settings_type))

    def method_settings(self, settings_type: type):
        """The settings of ``settings_type`` this recipe holds (its BARTER or masked settings)."""
        return getattr(self, self._method_field(settings_type))

    def with_method_settings(self, settings) -> "Recipe":
        """This recipe with ``settings`` in place of its own settings of that type."""
        return replace(self, **{self._method_field(type(settings)): settings})


#: recipe name -> recipe (``paper`` resolves to ``paper-cct`` or ``paper-vit`` by model family)
RECIPES: dict[str, Recipe] = {
    # Table 5, CCT: 200 epochs, batch 128, lr 3e-4 -> 0, wd 0.05 (warm-up and label
    # smoothing as in the reference CCT recipe).
    "paper-cct": Recipe("paper-cct", epochs=200, batch_size=128, lr=3e-4, min_lr=0.0,
                        weight_decay=0.05, warmup_fraction=0.05, drop_path=0.1),
    # Table 5, ViT: 100 epochs, batch 256, lr 2e-3 -> 1e-6, wd 0.05.
    "paper-vit": Recipe("paper-vit", epochs=100, batch_size=256, lr=2e-3, min_lr=1e-6,
                        weight_decay=0.05, warmup_fraction=0.1, drop_path=0.1),
    # a CPU's few epochs (CIFAR-10 in the book, Fashion-MNIST by default): updates are more
    # frequent and move more units, so that capacity still moves in so short a run.
    "quick": Recipe("quick", epochs=3, batch_size=128, lr=2e-3, min_lr=1e-5, weight_decay=0.05,
                    warmup_fraction=0.05,
                    barter=BarterSettings(delta_t=40, transfer_multiplier=4.0)),
    "smoke": Recipe("smoke", epochs=1, batch_size=64, lr=2e-3, min_lr=1e-5, weight_decay=0.05,
                    warmup_fraction=0.05, train_subset=640, eval_subset=1000,
                    barter=BarterSettings(delta_t=2, transfer_multiplier=8.0)),
}

RECIPE_NAMES = ("paper", "quick", "smoke")


def get_recipe(name: str, family: str) -> Recipe:
    choose("recipe", name, RECIPE_NAMES)
    return RECIPES[f"paper-{family}" if name == "paper" else name]
