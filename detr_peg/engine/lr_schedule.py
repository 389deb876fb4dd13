"""The learning-rate schedule: an optional linear warm-up per iteration, then StepLR per epoch.

The warm-up runs over the first ``train.warmup_iters`` iterations; the step
drop multiplies every learning rate by ``train.lr_gamma`` every
``train.lr_drop`` epochs. In training, :class:`~detr_peg.engine.hooks.LrScheduleHook`
steps both, the only place that does.
"""

from __future__ import annotations

from typing import Any

import torch

from detr_peg.config.schema import TrainConfig
from detr_peg.errors import ConfigError

#: Warm-up starts every learning rate at this fraction of its value.
WARMUP_START_FACTOR = 0.001


class LrSchedule:
    """Linear warm-up per iteration, then a step drop per epoch; one state dict for checkpoints.

    Both parts are torch schedulers in their chainable form (each multiplies
    the current learning rate), so a drop that falls inside the warm-up still
    applies.

    Args:
        optimizer: the optimizer whose group learning rates are scheduled.
        lr_drop: epochs between drops.
        lr_gamma: factor of each drop.
        warmup_iters: iterations over which every learning rate rises linearly
            from ``WARMUP_START_FACTOR`` times its value to its value (0: none).
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, *, lr_drop: int, lr_gamma: float, warmup_iters: int = 0
    ) -> None:
        self.drop = torch.optim.lr_scheduler.StepLR(optimizer, step_size=lr_drop, gamma=lr_gamma)
        self.warmup = None
        if warmup_iters > 0:
            self.warmup = torch.optim.lr_scheduler.LinearLR(
                optimizer, start_factor=WARMUP_START_FACTOR, total_iters=warmup_iters
            )

    def step_iteration(self) -> None:
        """Call after every optimizer step (advances the warm-up; a no-op after it)."""
        if self.warmup is not None and self.warmup.last_epoch < self.warmup.total_iters:
            self.warmup.step()

    def step(self) -> None:
        """Call after every completed epoch (the step drop)."""
        self.drop.step()

    def state_dict(self) -> dict[str, Any]:
        return {"drop": self.drop.state_dict(), "warmup": self.warmup.state_dict() if self.warmup is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (or a bare StepLR state of older checkpoints)."""
        if "drop" not in state:
            self.drop.load_state_dict(state)
            return
        self.drop.load_state_dict(state["drop"])
        if self.warmup is not None and state.get("warmup") is not None:
            self.warmup.load_state_dict(state["warmup"])


def build_lr_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> LrSchedule:
    """The schedule of ``train.warmup_iters``, ``train.lr_drop`` and ``train.lr_gamma``.

    Raises:
        ConfigError: ``lr_drop`` is not positive or ``warmup_iters`` is negative.
    """
    if cfg.lr_drop < 1:
        raise ConfigError(f"train.lr_drop must be a positive number of epochs, got {cfg.lr_drop}.")
    if cfg.warmup_iters < 0:
        raise ConfigError(
            f"train.warmup_iters must be 0 (no warm-up) or a positive number of iterations, got {cfg.warmup_iters}."
        )
    return LrSchedule(optimizer, lr_drop=cfg.lr_drop, lr_gamma=cfg.lr_gamma, warmup_iters=cfg.warmup_iters)


def current_lrs(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """The learning rate of each named group (``lr_transformer``, ``lr_backbone``, ...)."""
    return {f"lr_{g.get('name', i)}": g["lr"] for i, g in enumerate(optimizer.param_groups)}
