"""Training samples whose augmentation is a pure function of ``(seed, epoch, index)``: the data half of exact resume.

:class:`EpochSampleDataset` receives ``(epoch, index)`` keys (``(epoch, index, short_side)`` with one
training size per batch) from the sampler
(:class:`~detr_peg.engine.loader.EpochBatchSampler`) and seeds torch's and
Python's generators from them before the sample is read, inside
``fork_rng`` so the caller's generators are untouched. The result does not
depend on the number of data-loader workers, on which worker reads a sample,
or on where a run was resumed. (The model half, dropout's generators, is
saved in every checkpoint: :mod:`detr_peg.engine.checkpointing`.)
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from detr_peg.data.coco_dataset import CocoDetection
from detr_peg.data.transforms import resize_sample


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for sample ``index`` of ``epoch``, well mixed by ``numpy.random.SeedSequence``."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(epoch), int(index)]).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


class EpochSampleDataset(Dataset):
    """A dataset read with ``(epoch, index)`` or ``(epoch, index, short_side)`` keys, each sample seeded from them.

    Also reports, per sample, which images of a ``CocoDetection`` in
    ``on_bad_sample="skip"`` mode were left out to produce it: the sample of a
    bad index is the next readable index, so the indices between the
    requested one and the one returned are exactly the unreadable images.
    They are returned in ``target["skipped_image_ids"]`` (a list of COCO image
    ids, usually empty) so the main process can count them even when workers
    read the data.

    Args:
        dataset: a map-style dataset returning ``(image, target)``.
        seed: the run's seed (``train.seed``).
        max_size: the long-side cap of a key's short side (``data.train_max_size``).

    A key ``(epoch, index, short_side)`` (``data.train_size_per=batch``) also
    resizes the sample to that short side (:func:`~detr_peg.data.transforms.resize_sample`).
    """

    def __init__(self, dataset: Dataset, seed: int, max_size: int | None = None) -> None:
        super().__init__()
        self.dataset = dataset
        self.seed = int(seed)
        self.max_size = max_size

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, ...]) -> tuple[Any, dict[str, Any]]:
        epoch, index, *short = key
        python_state = random.getstate()
        try:
            with torch.random.fork_rng(devices=[]):
                s = sample_seed(self.seed, epoch, index)
                torch.manual_seed(s)
                random.seed(s)
                image, target = self.dataset[index]
        finally:
            random.setstate(python_state)
        if short:
            image, target = resize_sample(image, target, short[0], self.max_size)
        target["skipped_image_ids"] = self._skipped(index, target)
        return image, target

    def _skipped(self, index: int, target: dict[str, Any]) -> list[int]:
        base = self.dataset
        if not isinstance(base, CocoDetection) or "image_id" not in target:
            return []
        n = len(base.ids)
        requested = index % n
        if base.ids[requested] == target["image_id"]:
            return []
        returned = base.ids.index(target["image_id"])
        count = (returned - requested) % n
        return [base.ids[(requested + k) % n] for k in range(count)]
