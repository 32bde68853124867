"""barter_mini: structured dynamic sparse training (BARTER) of compact vision transformers.

The paper
    BARTER: structured dynamic sparse training that keeps the training tensors of a vision
    transformer physically compact and moves attention heads and FFN channels between its
    layers under fixed global budgets, pruning the least useful units elsewhere and cloning
    the most useful units of the layer that needs capacity most (its Figure 2). Evaluated on
    CCT/CIFAR-100 and ViT/Tiny-ImageNet at densities 0.1-0.7 against SET (Mocanu et al.,
    2018), SNFS (Dettmers & Zettlemoyer, 2019), RigL (Evci et al., 2020), SRigL (Lasby et
    al., 2023) and S2ViTE (Chen et al., 2021). Table and figure numbers in this package's
    docstrings are that paper's.

The layers, each importing only those before it:

``core``      models, budgets, unit statistics, surgery, the topology update, counts
``masked``    the full-tensor masked baselines
``training``  the method registry, trainer, recipes, data, checkpoints, export, run cache
``measure``   timing, memory and ``barter-mini bench``
``book``      notebook profiles, experiment grids, tables, figures and the book build

Start here::

    import barter_mini as bm
    model = bm.build_model(bm.get_model_config("cct-mini"), density=0.3)
    metrics = bm.train(bm.RunConfig(method="barter", density=0.3, epochs=1), "runs/barter")

From a trained dense model (one of this package's, or a stock timm ViT)::

    vit = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, num_classes=10)
    bm.cut_to_density(vit, 0.3, calibration_batches)        # the same object, compact tensors
    controller = bm.BarterController(vit, optimizer, total_steps)
"""

import warnings

# timm imports huggingface_hub, whose progress bars import tqdm.auto: in a Jupyter kernel
# without ipywidgets that warns "IProgress not found" into every notebook that imports this
# package (barter_mini draws no widgets; its bars are plain tqdm). Only that message is silenced.
warnings.filterwarnings("ignore", message="IProgress not found")

from .version import __version__  # noqa: E402
from .core.barter import BarterSettings, TransferSchedule, topology_update
from .core.barter_controller import BarterController
from .core.budgets import Allocation, Budget, compute_budget, initial_allocation
from .core.configs import MODEL_CONFIGS, ModelConfig
from .core.counting import count_parameters, training_gflops_per_image
from .core.dense_start import calibration_importance, cut_to_density, oneshot_allocation
from .core.method import MethodController
from .core.models import build_model, describe_timm_vit, get_model_config
from .core.surgery import allocation_of
from .core.unit_statistics import UnitStatistics
from .errors import BarterError
from .training.checkpoints import load_checkpoint, model_from_checkpoint
from .training.data import load_dataset, make_loaders
from .training.export import export_run
from .training.methods import METHODS, get_method
from .training.run_config import RunConfig
from .training.trainer import train

__all__ = [
    "__version__", "Allocation", "BarterController", "BarterError", "BarterSettings", "Budget",
    "METHODS", "MODEL_CONFIGS", "MethodController", "ModelConfig", "RunConfig", "TransferSchedule",
    "UnitStatistics", "allocation_of", "build_model", "calibration_importance", "compute_budget",
    "count_parameters", "cut_to_density", "describe_timm_vit", "export_run", "get_method",
    "get_model_config", "initial_allocation", "load_checkpoint", "load_dataset", "make_loaders",
    "model_from_checkpoint", "oneshot_allocation", "topology_update", "train", "training_gflops_per_image",
]
