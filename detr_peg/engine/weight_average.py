"""An exponential moving average (EMA) of the model's weights (kept by :class:`~detr_peg.engine.hooks.WeightAverageHook`).

RT-DETR, D-FINE and RF-DETR evaluate such an average rather than the weights
of the last step: it smooths the noise of the last few hundred steps, which
narrows the spread between seeds of a short run. With ``train.ema_decay``
``d > 0``, after every optimizer step every floating-point parameter and
buffer (BatchNorm running statistics included) of the average moves towards
the model's::

    average = decay_n * average + (1 - decay_n) * model,
    decay_n = d * (1 - exp(-n / train.ema_warmup_iters))

where ``n`` counts the updates made so far (RT-DETR's ramp: early averages
follow the fast-changing model closely; ``ema_warmup_iters = 0`` uses ``d``
from the first update). Integer buffers (BatchNorm's batch counters) are
copied. The first update copies the model.

The average is what the run evaluates and what its checkpoint stores as
``model`` (so ``eval``, ``predict``, ``export`` and ``train.init_from`` use
it with no option); the weights the optimizer steps are stored as
``train_weights`` and the update count as ``ema_updates``, so ``--resume``
continues both exactly. The averaging itself is
:class:`torch.optim.swa_utils.AveragedModel`.
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
    """The decay of update number ``updates + 1`` (``updates`` made before it; see the module docstring)."""
    if warmup_iters <= 0:
        return decay
    return decay * (1.0 - math.exp(-updates / warmup_iters))


class WeightAverage:
    """The exponential moving average of a model's parameters and buffers.

    Args:
        model: the bare detector being trained (not wrapped in DDP or ``torch.compile``).
        decay: the target decay ``d`` (0 < d < 1).
        warmup_iters: the ramp of the decay, in updates (0: none).

    Attributes:
        module: the averaged copy of ``model`` (same class, same state-dict keys), in evaluation mode.
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
