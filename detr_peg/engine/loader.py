"""Data loaders for training and evaluation, sharded over processes.

Training order: every epoch, a permutation drawn from a generator seeded with
``seed + epoch`` (``DistributedSampler``'s ``set_epoch`` rule), padded to a
multiple of the number of processes and dealt out round-robin, so process
``r`` of ``N`` gets positions ``r, r + N, ...``. With one process of batch
``N * B`` or ``N`` processes of batch ``B``, iteration ``i`` covers the same
images. Batches are whole (``drop_last``), as in the official code.

Resuming mid-epoch skips the batches already done without reading them.

Every batch is padded to a multiple of ``size_divisibility``, the model's
coarsest feature stride (``model.size_divisibility``), so each level's
padding mask gives an image the valid extent it has alone (see
:mod:`detr_peg.models.masking`). This is a difference from the official data
pipelines, which pad to the largest image only.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler

from detr_peg.config.schema import Config
from detr_peg.data.collate import collate_detection
from detr_peg.data.epoch_samples import EpochSampleDataset
from detr_peg.engine.distributed import DistEnv
from detr_peg.errors import ConfigError, UserError

T = TypeVar("T")


class EpochBatchSampler(Sampler[list[tuple[int, ...]]]):
    """Batches of ``(epoch, index)`` keys for :class:`EpochSampleDataset`, or ``(epoch, index, short_side)``.

    With ``sizes``, each batch also carries one short side drawn from them,
    a function of ``(seed, epoch, batch number)`` only: every process of a
    distributed run draws the same size for the same step, and a resumed
    epoch draws the sizes of the uninterrupted one.

    Args:
        num_samples: size of the dataset.
        batch_size: samples per batch in this process.
        epoch: the epoch whose order is drawn.
        seed: the run's seed.
        rank: this process.
        world_size: number of processes.
        start_batch: batches of the epoch to skip (resuming mid-epoch).
        sizes: short sides to draw one of per batch (``data.train_size_per=batch``); empty: none.
    """

    def __init__(
        self,
        *,
        num_samples: int,
        batch_size: int,
        epoch: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        start_batch: int = 0,
        sizes: Sequence[int] = (),
    ) -> None:
        self.epoch = epoch
        self.start_batch = start_batch
        self.sizes = [int(s) for s in sizes]
        self.seed = int(seed)
        order = DistributedSampler(
            range(num_samples), num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=False
        )
        order.set_epoch(epoch)
        self._batches = list(BatchSampler(list(order), batch_size, drop_last=True))

    @property
    def batches_per_epoch(self) -> int:
        """Whole batches in the epoch, skipped ones included."""
        return len(self._batches)

    def __len__(self) -> int:
        return max(len(self._batches) - self.start_batch, 0)

    def __iter__(self) -> Iterator[list[tuple[int, ...]]]:
        for number in range(self.start_batch, len(self._batches)):
            batch = self._batches[number]
            if not self.sizes:
                yield [(self.epoch, index) for index in batch]
                continue
            draw = np.random.default_rng([self.seed & 0xFFFFFFFF, self.epoch, number]).integers(len(self.sizes))
            yield [(self.epoch, index, self.sizes[draw]) for index in batch]


def batches_per_epoch(num_samples: int, batch_size: int, world_size: int) -> int:
    """Training iterations per epoch (whole batches per process)."""
    per_process = -(-num_samples // world_size)
    return per_process // batch_size


def check_train_size(num_samples: int, cfg: Config, world_size: int) -> int:
    """Iterations per epoch; a clear error when the data cannot fill one batch.

    Raises:
        ConfigError: fewer training images than ``batch_size * processes``.
    """
    batch = cfg.train.batch_size
    if batch < 1:
        raise ConfigError(f"train.batch_size must be at least 1, got {batch}.")
    iters = batches_per_epoch(num_samples, batch, world_size)
    if iters == 0:
        raise ConfigError(
            f"The training set has {num_samples} images, fewer than train.batch_size {batch} x "
            f"{world_size} processes; lower train.batch_size."
        )
    return iters


def iterate_batches(loader: Iterable[T]) -> Iterator[T]:
    """Iterate ``loader``, re-raising a user error from a worker process with its own one-line message.

    ``DataLoader`` re-raises a worker's exception with the worker's whole
    traceback in the message; a :class:`~detr_peg.errors.UserError` (an
    unreadable image with ``data.on_bad_sample=error``) is meant to be one
    sentence, so the original message is recovered from the last line.
    """
    iterator = iter(loader)
    try:
        while True:
            message = None
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except UserError as exc:
                text, marker = str(exc), f"{type(exc).__name__}: "
                if "Original Traceback" not in text or marker not in text:
                    raise
                error_type, message = type(exc), text.rsplit(marker, 1)[1].strip()
            if message is not None:
                # Raised outside the except block, so the worker's traceback (which holds the
                # iterator and thus its worker processes) is not kept as the context.
                raise error_type(message)
            yield batch
    finally:
        # Dropping the iterator stops its worker processes now, also when an error propagates.
        del iterator


def _ignore_interrupts(worker_id: int) -> None:
    """Workers leave Ctrl-C (sent to the whole process group) to the main process, which stops cleanly.

    SIGTERM keeps its default: the loader and Python's exit handlers stop
    workers with it.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def build_train_loader(
    dataset: Dataset, cfg: Config, env: DistEnv, *, epoch: int, size_divisibility: int, start_batch: int = 0
) -> DataLoader:
    """The training loader of one epoch.

    Args:
        dataset: the training dataset (plain, indexed by int).
        cfg: uses ``train.batch_size``, ``train.seed`` and ``data.num_workers``.
        env: this process.
        epoch: the epoch (selects the order and the augmentation seeds).
        size_divisibility: pad batches to a multiple of it (``model.size_divisibility``).
        start_batch: batches already done in this epoch.

    Returns:
        A loader yielding ``(images, mask, targets)`` from
        :func:`~detr_peg.data.collate.collate_detection`; each target also has
        ``skipped_image_ids``.
    """
    sampler = EpochBatchSampler(
        num_samples=len(dataset),
        batch_size=cfg.train.batch_size,
        epoch=epoch,
        seed=cfg.train.seed,
        rank=env.rank,
        world_size=env.world_size,
        start_batch=start_batch,
        sizes=cfg.data.train_scales if cfg.data.train_size_per == "batch" else (),
    )
    workers = max(cfg.data.num_workers, 0)
    return DataLoader(
        EpochSampleDataset(dataset, cfg.train.seed, max_size=cfg.data.train_max_size),
        batch_sampler=sampler,
        collate_fn=functools.partial(collate_detection, size_divisibility=size_divisibility),
        num_workers=workers,
        pin_memory=env.device.type == "cuda",
        worker_init_fn=_ignore_interrupts if workers > 0 else None,
        generator=_private_generator(cfg.train.seed, epoch),
    )


def _private_generator(seed: int, epoch: int) -> torch.Generator:
    """A generator for the loader's own draws (worker base seeds).

    Without it, creating a loader iterator draws from the global generator,
    which also drives dropout, so resuming mid-epoch would shift the model's
    random numbers.
    """
    return torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))


def image_sizes(dataset: Dataset) -> list[tuple[int, int]]:
    """The stored ``(height, width)`` of every image of a :class:`~detr_peg.data.coco_dataset.CocoDetection`.

    Taken from the annotation file; an image it gives no size for is measured
    from its file header.
    """
    from PIL import Image

    sizes = []
    for index, image_id in enumerate(dataset.ids):
        info = dataset.coco.imgs[image_id]
        if "height" in info and "width" in info:
            sizes.append((int(info["height"]), int(info["width"])))
        else:
            with Image.open(dataset.image_path(index)) as img:
                sizes.append((img.height, img.width))
    return sizes


class SizeGroupedBatchSampler(Sampler[list[int]]):
    """Batches of indices whose images have the same stored size, so no batch needs padding.

    The evaluation resize is deterministic, so images of equal stored size
    have equal model-input size. Groups keep the order of their first image;
    each group is cut into batches of at most ``batch_size``.

    Args:
        indices: this process's dataset indices, in order.
        sizes: the stored size of every dataset index.
        batch_size: most images per batch.
    """

    def __init__(self, indices: Iterable[int], sizes: list[tuple[int, int]], batch_size: int) -> None:
        groups: dict[tuple[int, int], list[int]] = {}
        for index in indices:
            groups.setdefault(sizes[index], []).append(index)
        self._batches = [
            group[i : i + batch_size] for group in groups.values() for i in range(0, len(group), batch_size)
        ]

    def __len__(self) -> int:
        return len(self._batches)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches)


#: ``eval.padding_mode`` values: ``mixed`` batches images in dataset order (padding to the largest);
#: ``exact`` batches only images of equal size (no padding, so outputs equal one image at a time).
PADDING_MODES = ("mixed", "exact")


def build_eval_loader(
    dataset: Dataset,
    batch_size: int,
    num_workers: int,
    env: DistEnv,
    *,
    size_divisibility: int,
    padding_mode: str = "mixed",
) -> DataLoader:
    """The evaluation loader: this process's shard in dataset order, batches padded to ``size_divisibility``.

    ``DistributedSampler`` pads the shards to equal length by repeating
    images; the evaluation removes the repeats by image id. With
    ``padding_mode="exact"`` the shard is batched by equal image size
    (:class:`SizeGroupedBatchSampler`; needs a
    :class:`~detr_peg.data.coco_dataset.CocoDetection`).
    """
    if batch_size < 1:
        raise ConfigError(f"eval.batch_size must be at least 1, got {batch_size}.")
    if padding_mode not in PADDING_MODES:
        raise ConfigError(f"eval.padding_mode is {padding_mode!r}; valid values are {', '.join(PADDING_MODES)}.")
    sampler = DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank, shuffle=False, drop_last=False)
    batching: dict = {"batch_size": batch_size, "sampler": sampler}
    if padding_mode == "exact":
        batching = {"batch_sampler": SizeGroupedBatchSampler(sampler, image_sizes(dataset), batch_size)}
    workers = max(num_workers, 0)
    return DataLoader(
        dataset,
        **batching,
        collate_fn=functools.partial(collate_detection, size_divisibility=size_divisibility),
        num_workers=workers,
        pin_memory=env.device.type == "cuda",
        worker_init_fn=_ignore_interrupts if workers > 0 else None,
        generator=_private_generator(0, 0),
    )
