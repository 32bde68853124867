"""Real image-classification datasets for the small vision transformers.

Every dataset comes from a real loader: torchvision's dataset classes (Fashion-MNIST,
CIFAR-100, ``ImageFolder`` for Tiny-ImageNet), scikit-learn's bundled ``load_digits``, or a
few lines reading Tiny-ImageNet's official validation annotations. Nothing here invents data.

Each dataset is cut into three splits (see :class:`~.DataSplits`):

* ``train`` -- the official training split minus the validation part, augmented when asked;
* ``val``   -- a seeded random ``val_fraction`` of the official training split, disjoint from
  ``train`` and *never* augmented (model selection must not see random crops);
* ``test``  -- the official test split (Tiny-ImageNet has no labelled test split, so its
  official ``val`` folder plays that role), never augmented.

``train`` and ``val`` are :class:`torch.utils.data.Subset` views with disjoint index sets over
two dataset objects that read the same files: one with the augmenting transform, one plain.
The plain one is made first and the augmented one is a shallow copy with another transform,
so the decoded arrays are held once.

Items are ``(float tensor C x H x W normalised with DatasetInfo.mean/std, int label)``.

``classes`` keeps only some of a dataset's classes, relabelled ``0..k-1`` in the order given
(:func:`~.select_classes`): two disjoint halves of Fashion-MNIST make a transfer task that runs
offline, pretraining on one half and fine-tuning on the other (the fine-tuning chapter).

Where files are looked for: ``root`` (default :func:`~.default_data_root`); see
``data/README.md`` for the layout of each dataset and how to obtain it.

The package, a module per concern: :mod:`.info` (what each dataset is, the three splits),
:mod:`.files` (finding, unpacking and checking the files on disk), :mod:`.datasets` (one
loader per dataset, the transforms and the seeded validation cut), :mod:`.views` (a subset of
the classes, relabelled; images resized) and :mod:`.loaders` (batches, shuffled and shared
among data-parallel processes).
"""

from .datasets import TinyImageNetVal, fetch_dataset, load_dataset
from .files import FASHION_MNIST_DEBIAN_DIR, TINY_IMAGENET_URL
from .info import DATASETS, DataSplits, DatasetInfo, default_data_root
from .loaders import GlobalBatchSampler, make_loaders
from .views import parse_classes, resize_images, select_classes

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "DataSplits",
    "TinyImageNetVal",
    "default_data_root",
    "load_dataset",
    "fetch_dataset",
    "GlobalBatchSampler",
    "make_loaders",
    "parse_classes",
    "select_classes",
    "resize_images",
    "FASHION_MNIST_DEBIAN_DIR",
    "TINY_IMAGENET_URL",
]
