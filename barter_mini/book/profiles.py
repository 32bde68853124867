"""Notebook profiles: how much compute a notebook spends.

``quick``  CPU-sized: meaningful figures on CIFAR-10 in minutes on two cores.
``long``   the quick recipe for 10 epochs on the full training split (about 10x a quick run).
``smoke``  seconds: a few hundred images, for tests of the notebooks and the book.
``paper``  the paper's settings (cct-paper on CIFAR-100, Table 5 recipe), for a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..core.budgets import check_density, compute_budget
from ..core.models import get_model_config
from ..errors import check_list, check_seed, choose
from ..training.cache import cached_train
from ..training.data import DATASETS
from ..training.run_config import RunConfig
from .tables import settings_markdown


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    dataset: str
    recipe: str
    #: None: the recipe's
    epochs: int | None
    #: training images of each run (None: all)
    train_subset: int | None
    #: training images of each run in notebooks that train a grid of runs (None: all)
    grid_train_subset: int | None = None
    #: the precision of every run's forward pass (core.execution.PRECISIONS): bf16 where the
    #: profile is meant for a GPU
    precision: str = "fp32"
    #: the run cache the runs are read from and trained into (None: $BARTER_MINI_CACHE or
    #: runs/cache, :func:`~barter_mini.training.cache.default_cache_dir`)
    cache_dir: Path | None = None
    #: whether a run the cache lacks is trained (None: as $BARTER_MINI_TRAIN says); a
    #: recorded grid reads its runs with False, so a missing run is an error, not a training
    train_missing: bool | None = None

    def cached_train(self, run: RunConfig) -> dict:
        """``run``'s metrics from this profile's run cache, trained there if missing and
        allowed (:func:`~barter_mini.training.cache.cached_train`)."""
        return cached_train(run, self.cache_dir, self.train_missing)

    def _repr_markdown_(self) -> str:
        """The banner every chapter shows first (what this build's own runs are worth), then
        the settings."""
        banner = f"> **This page was built with the `{self.name}` profile.** {BUILT_WITH[self.name]}"
        return banner + "\n\n" + settings_markdown(
            self, f"Profile `{self.name}`", {"epochs": "the recipe's", "train_subset": "all", "grid_train_subset": "all"},
            leave_out=("cache_dir", "train_missing"))


#: what a page's own runs are worth under each profile, said at the top of every chapter: a
#: reader must know it before reading one of this build's numbers
BUILT_WITH = {
    "quick": "Its own runs are CPU-sized (the settings below), one seed unless the parameters ask "
             "for more, and its timings one run on the machine that built it: they are drawn beside "
             "the recorded grids, and no conclusion rests on them.",
    "long": "Its own runs train the quick recipe for ten times as long (the settings below): they are "
            "drawn beside the recorded grids, which were trained with the quick profile and carry "
            "the conclusions.",
    "smoke": "Its own runs train on a few hundred images for one epoch, to show that the page runs: "
             "their accuracies, times and allocations mean nothing. The conclusions rest on the "
             "recorded grids, which no profile changes.",
    "paper": "Its own runs use the paper's models, data and recipes (the settings below), for a GPU: "
             "they are the numbers to set beside the paper's. The recorded grids and the conclusions "
             "written against them are the quick profile's.",
}


#: the notebooks train some 60 runs: a third of CIFAR-10's 45,000 training images keeps the
#: quick book within 45 minutes on two cores (and the walkthrough's run is then chapter 02's)
GRID_SUBSET_QUICK = 15000
#: the book's dataset: hard enough for the allocation of a small model to matter (on
#: Fashion-MNIST an even split is already close to the best one); ``dataset`` picks another
BOOK_DATASET = "cifar10"

PROFILES: dict[str, Profile] = {
    "quick": Profile("quick", model="cct-mini", dataset=BOOK_DATASET, recipe="quick", epochs=3,
                     train_subset=GRID_SUBSET_QUICK, grid_train_subset=GRID_SUBSET_QUICK),
    "long": Profile("long", model="cct-mini", dataset=BOOK_DATASET, recipe="quick", epochs=10,
                    train_subset=None, grid_train_subset=None),
    "smoke": Profile("smoke", model="cct-mini", dataset=BOOK_DATASET, recipe="smoke", epochs=1,
                     train_subset=512, grid_train_subset=512),
    "paper": Profile("paper", model="cct-paper", dataset="cifar100", recipe="paper", epochs=None,
                     train_subset=None, precision="bf16"),
}

#: the datasets a notebook may name: every dataset a run may
DATASET_NAMES = tuple(DATASETS)


#: the default of :func:`resolve_profile`'s list parameters: the notebook has no such parameter
#: (``None`` is a value a notebook could be given, so it cannot mean this)
NOT_A_PARAMETER = object()


def resolve_profile(profile: str, dataset: str = "default", densities=NOT_A_PARAMETER,
                    seeds=NOT_A_PARAMETER) -> Profile:
    """Check a notebook's parameters and return its profile, with ``dataset`` applied.

    ``dataset="default"`` keeps the profile's own dataset. ``densities`` and ``seeds``, where
    given (the notebook has such a parameter), must be non-empty lists (a notebook
    passes ``[density]`` for one): every density in (0, 1] and large
    enough to keep a head in every layer of the profile's model, every seed an integer in
    [0, 2**32 - 1], so that no grid fails after some of its runs have trained. Bad values
    raise the one-line :class:`~barter_mini.errors.BarterError` that papermill shows as the
    notebook's failure.
    """
    choose("profile", profile, PROFILES)
    chosen = PROFILES[profile]
    if dataset != "default":
        choose("dataset", dataset, DATASET_NAMES)
        chosen = replace(chosen, dataset=dataset)
    config = get_model_config(chosen.model)
    for density in [] if densities is NOT_A_PARAMETER else check_list("densities", densities, "numbers in (0, 1]"):
        compute_budget(config, check_density(density))
    for seed in [] if seeds is NOT_A_PARAMETER else check_list("seeds", seeds, "integers in [0, 2**32 - 1]"):
        check_seed("every seed", seed)
    return chosen
