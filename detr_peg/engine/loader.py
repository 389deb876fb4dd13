"""Data loaders for training and evaluation, sharded over processes, batches padded to ``model.size_divisibility``.

Process ``r`` of ``N`` gets positions ``r, r + N, ...`` of each epoch's permutation, so ``N`` processes of batch
``B`` see the images of one process of batch ``N * B``; training batches are whole (``drop_last``).
"""

from __future__ import annotations

import functools
import resource
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
    """Batches of ``(epoch, index)`` keys of :class:`EpochSampleDataset`, ``(epoch, index, short_side)`` with ``sizes``.

    The order is ``DistributedSampler``'s for ``seed`` and ``epoch``; ``start_batch`` skips batches done before a
    resume. A batch's short side depends on ``(seed, epoch, batch number)`` only, so every process and a resumed
    epoch draw the same sizes.
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


def check_train_size(num_samples: int, batch_size: int, world_size: int) -> int:
    """Iterations per epoch; ConfigError when the images cannot fill one batch in every process."""
    iters = batches_per_epoch(num_samples, batch_size, world_size)
    if iters == 0:
        raise ConfigError(
            f"The training set has {num_samples} images, fewer than train.batch_size {batch_size} x "
            f"{world_size} processes; lower train.batch_size."
        )
    return iters


#: Open files needed with loader workers, which pass tensors as file descriptors (with too few, the loader hangs).
MIN_OPEN_FILES = 1024


def check_open_files(workers: int) -> None:
    """With ``workers``, raise a soft open-file limit below :data:`MIN_OPEN_FILES` to it; ConfigError if it cannot."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if workers and 0 <= soft < MIN_OPEN_FILES:  # RLIM_INFINITY is -1 (Linux) or huge
        if 0 <= hard < MIN_OPEN_FILES:
            raise ConfigError(
                f"data.num_workers={workers} needs at least {MIN_OPEN_FILES} open files (loader workers pass tensors "
                f"as file descriptors), but this process may have {hard} (ulimit -n); raise it or set data.num_workers=0."
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (MIN_OPEN_FILES, hard))


def iterate_batches(loader: Iterable[T]) -> Iterator[T]:
    """Iterate ``loader``, re-raising a worker's :class:`~detr_peg.errors.UserError` with its one-line message only."""
    check_open_files(getattr(loader, "num_workers", 0))
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
    """Workers ignore SIGINT (sent to the whole group) so the main process stops cleanly; SIGTERM keeps its default."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def build_train_loader(
    dataset: Dataset, cfg: Config, env: DistEnv, *, epoch: int, size_divisibility: int, start_batch: int = 0
) -> DataLoader:
    """The training loader of ``epoch`` from batch ``start_batch``, batches padded to ``size_divisibility``.

    Yields :func:`~detr_peg.data.collate.collate_detection`'s ``(images, mask, targets)``; each target also has
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
    """The loader's own generator: creating an iterator must not draw from the global one, which drives dropout."""
    return torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))


def image_sizes(dataset: Dataset) -> list[tuple[int, int]]:
    """Stored ``(height, width)`` of every image of a CocoDetection (from the annotations, else the file header)."""
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
    """Batches of at most ``batch_size`` indices of one stored image size (so no padding), in first-image order."""

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
    """This process's shard in dataset order, padded to ``size_divisibility``; ``exact`` batches equal sizes only.

    ``DistributedSampler`` repeats images to even out the shards; the evaluation drops repeats by image id.
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
