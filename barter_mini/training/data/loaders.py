"""Batches: :class:`~.GlobalBatchSampler` (shuffled global batches, each process's share,
resumable inside an epoch), :class:`~.TensorBatches` (a split held in memory, a whole batch
gathered and augmented at once on the training device) and :func:`~.make_loaders` (the
train, val and test loaders)."""

from __future__ import annotations

import os

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler, SequentialSampler, Subset

from ...errors import BarterError, check_integer
from .batches import BatchSource, batch_source
from .info import DataSplits

#: worker processes that load a dataset's files (Tiny-ImageNet) unless told (make_loaders)
FILE_WORKERS = 4


class GlobalBatchSampler(Sampler[list[int]]):
    """Shuffled global batches cut into this process's share, resumable inside an epoch.

    Every epoch draws one permutation of the training split from the loader's generator
    (:class:`~torch.utils.data.RandomSampler`, the same draws as ``shuffle=True``) and cuts it
    into global batches of ``batch_size``. Process ``rank`` of ``world_size`` takes positions
    ``rank, rank + world_size, ...`` of each global batch, so the processes of a
    data-parallel run together see exactly the batches a single process would, and the
    mean of their gradients is the single process's gradient.

    ``skip`` (set before iterating) passes over that many batches at the start of the next
    epoch without loading them: a resumed run continues inside an epoch without drawing the
    augmentations' random numbers of the batches it already trained on.

    ``seeds`` (a generator: the loader's) pairs every index with a seed of its own, for
    :class:`SeededItems`: after the epoch's shuffle one seed per global batch is drawn for all
    of the epoch's batches, and the image at position ``p`` of batch ``b`` gets ``seed_b + p``.
    An image's augmentation then depends on neither the worker process that loads it, nor
    the number of processes, nor the batches a resumed run skips.
    """

    def __init__(self, sampler: Sampler[int], batch_size: int, drop_last: bool,
                 rank: int = 0, world_size: int = 1, seeds: torch.Generator | None = None):
        self.batches = BatchSampler(sampler, batch_size, drop_last)
        if batch_size % world_size:
            raise BarterError(f"a global batch of {batch_size} cannot be split evenly over {world_size} processes: "
                              "choose a batch size that is a multiple of the number of processes")
        self.rank, self.world_size, self.skip, self.seeds = rank, world_size, 0, seeds

    def __iter__(self):
        skip, self.skip = self.skip, 0
        batches = list(self.batches)          # the epoch's shuffle, drawn whole either way
        seeds = (torch.randint(0, 2 ** 62, (len(batches),), generator=self.seeds).tolist()
                 if self.seeds is not None else None)
        for index, batch in enumerate(batches):
            if index >= skip:
                if seeds is not None:
                    batch = [(item, seeds[index] + position) for position, item in enumerate(batch)]
                yield batch[self.rank::self.world_size]

    def __len__(self) -> int:
        return len(self.batches)


class SeededItems(Dataset):
    """``dataset`` whose item ``(index, seed)`` is ``dataset[index]`` drawn under its own
    ``seed``: the augmentation's random numbers come from a generator seeded for that image
    alone (the caller's generator state is left as it was), in whatever process loads it."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]):
        index, seed = item
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.dataset[index]


class TensorBatches:
    """The batches of a split held in memory (:mod:`.batches`), gathered from its tensors on
    ``device`` a whole batch at a time: what a ``DataLoader`` over it would yield, with the
    same ``dataset``, ``batch_sampler`` (and so the same order, shares and resumable skip) and
    ``generator``, without a Python call per image."""

    def __init__(self, dataset: Dataset, batch_sampler: Sampler[list[int]], device: torch.device,
                 generator: torch.Generator | None = None, source: BatchSource | None = None,
                 moved: dict | None = None):
        source = source if source is not None else batch_source(dataset)
        if source is None:
            raise ValueError(f"{type(dataset).__name__} is not held in memory: load it with a DataLoader")
        self.dataset, self.batch_sampler, self.generator = dataset, batch_sampler, generator
        self.source = source.to(device, moved)
        self.device = torch.device(device)

    def __iter__(self):
        for positions in self.batch_sampler:
            yield self.source.batch(torch.as_tensor(positions, dtype=torch.long))

    def __len__(self) -> int:
        return len(self.batch_sampler)


def make_loaders(
    splits: DataSplits, batch_size: int, seed: int, num_workers: int | None = None, rank: int = 0, world_size: int = 1,
    device: torch.device | str = "cpu",
) -> tuple:
    """(train, val, test) loaders.

    The training loader shuffles with its own ``torch.Generator`` seeded by ``seed``, so the
    batch order is reproducible and independent of the global RNG; it drops the last partial
    batch only when at least one full batch exists (a tiny ``train_subset`` still trains).
    Its batches are :class:`GlobalBatchSampler`'s: ``batch_size`` is the global batch, of
    which process ``rank`` of ``world_size`` loads its share; of validation and test it
    loads every ``world_size``-th image from ``rank`` on, so together they see each once.
    Validation and test are not shuffled and keep every item.

    Where every split is held in memory (:func:`~.batches.batch_source`) the loaders are
    :class:`TensorBatches`: the tensors move to ``device`` once, and a batch's crops and flips
    are drawn for the whole batch from the global torch generator. Otherwise (Tiny-ImageNet's
    files) they are ``DataLoader`` objects with ``num_workers`` worker processes (default
    :data:`FILE_WORKERS`, at most the CPUs) that load and augment one image at a time, each
    under a seed of its own (:class:`SeededItems`), and yield CPU tensors.
    """
    batch_size = check_integer("batch_size", batch_size)
    num_workers = (min(FILE_WORKERS, os.cpu_count() or 1) if num_workers is None
                   else check_integer("num_workers", num_workers, minimum=0))
    generator = torch.Generator().manual_seed(int(seed))
    drop_last = len(splits.train) >= batch_size
    if not drop_last and world_size > 1:
        raise BarterError(f"{len(splits.train)} training images make no global batch of {batch_size}: "
                          "a data-parallel run needs at least one full batch")

    def batches(seeded: bool) -> GlobalBatchSampler:
        return GlobalBatchSampler(RandomSampler(splits.train, generator=generator), batch_size, drop_last,
                                  rank, world_size, seeds=generator if seeded else None)

    def share(split: Dataset) -> Dataset:       # every process evaluates its own images
        return split if world_size == 1 else Subset(split, range(rank, len(split), world_size))

    views = (splits.train, share(splits.val), share(splits.test))
    sources = [batch_source(split) for split in views]
    if all(source is not None for source in sources):
        moved: dict = {}                        # the training and validation views share one copy
        train = TensorBatches(views[0], batches(seeded=False), device, generator, sources[0], moved)
        return (train, *(TensorBatches(split, BatchSampler(SequentialSampler(split), batch_size, False), device,
                                       source=source, moved=moved) for split, source in zip(views[1:], sources[1:])))
    # workers are started anew every epoch: a persistent iterator would skip the seed draw a
    # new one makes, so a resumed run (a new iterator) would shuffle differently
    common = dict(num_workers=num_workers)
    train = DataLoader(SeededItems(splits.train), batch_sampler=batches(seeded=True), generator=generator, **common)
    return (train, *(DataLoader(split, batch_size=batch_size, shuffle=False, **common) for split in views[1:]))
