"""Training samples whose augmentation is a pure function of ``(seed, epoch, index)``: the data half of exact resume.

Independent of worker count, worker assignment and resume point; the caller's generators are untouched.
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
    """A 63-bit seed for sample ``index`` of ``epoch``, mixed by ``numpy.random.SeedSequence``."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(epoch), int(index)]).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


class EpochSampleDataset(Dataset):
    """A dataset read with ``(epoch, index[, short_side])`` keys, torch and Python RNGs seeded from them.

    A ``short_side`` resizes the sample (:func:`~detr_peg.data.transforms.resize_sample`, long side at most
    ``max_size``). ``target["skipped_image_ids"]`` lists the COCO image ids a ``CocoDetection`` in ``skip`` mode
    passed over to reach this sample, so the main process can count them when workers read the data.
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
