"""An exponential moving average (EMA) of the model's weights, which the run evaluates and stores as ``model``.

The stepped weights are stored as ``train_weights`` and the update count as ``ema_updates``, so ``--resume`` is exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel

#: Checkpoint entries of a run with an average: the stepped weights and the number of updates.
TRAIN_WEIGHTS = "train_weights"
EMA_UPDATES = "ema_updates"


def ema_decay(decay: float, warmup_iters: int, updates: int) -> float:
    """The decay of update ``updates + 1``: ``decay * (1 - exp(-updates / warmup_iters))``; ``decay`` if no warm-up."""
    if warmup_iters <= 0:
        return decay
    return decay * (1.0 - math.exp(-updates / warmup_iters))


class WeightAverage:
    """EMA of ``model``'s floating parameters and buffers (integer buffers copied; the first update copies the model).

    ``model`` is the bare detector; ``module`` is the averaged copy (same state-dict keys) in eval mode.
    """

    def __init__(self, model: nn.Module, *, decay: float, warmup_iters: int) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must lie strictly between 0 and 1, got {decay!r}")
        self.decay, self.warmup_iters = decay, warmup_iters
        self._averaged = AveragedModel(model, multi_avg_fn=self._average, use_buffers=True)
        self._averaged.requires_grad_(False)
        self.module: nn.Module = self._averaged.module
        self.module.eval()

    @property
    def updates(self) -> int:
        """How many times :meth:`update` ran."""
        return int(self._averaged.n_averaged.item())

    def _average(self, averaged: list[Tensor], current: list[Tensor], n_averaged: Tensor) -> None:
        """Move ``averaged`` towards ``current`` in place (one dtype and device per call)."""
        if not averaged[0].is_floating_point():
            torch._foreach_copy_(averaged, current)
            return
        weight = 1.0 - ema_decay(self.decay, self.warmup_iters, int(n_averaged.item()))
        torch._foreach_lerp_(averaged, current, weight)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One step of the average towards ``model``'s current weights."""
        self._averaged.update_parameters(model)

    def state_dict(self) -> dict[str, Tensor]:
        """The averaged weights, under the model's own keys."""
        return self.module.state_dict()

    def load(self, state: Mapping[str, Tensor], updates: int) -> None:
        """Restore an average saved by :meth:`state_dict` after ``updates`` updates (resume)."""
        self.module.load_state_dict(state)
        self._averaged.n_averaged.fill_(updates)
