"""The optimizer: AdamW over named parameter groups with the official per-part learning rates, and its
learning-rate schedule.

Three groups, as in the official DETR and Deformable-DETR training scripts:

* ``backbone``: parameters under ``backbone.``, at ``train.lr_backbone``;
* ``linear_proj``: parameters whose name contains any of
  ``train.lr_linear_proj_names`` (by default the deformable attention's
  ``sampling_offsets`` and the ``reference_points`` map), at
  ``train.lr * train.lr_linear_proj_mult``; DETR has no such parameters;
* ``transformer``: everything else (transformer, heads, input projections,
  positional encoding), at ``train.lr``.

A backbone parameter stays in ``backbone`` even if its name also matches a
linear-projection name, so no parameter is in two groups (the official script
would put it in both). Shared modules count once.

Every group gets ``train.weight_decay``; the fused AdamW implementation is
used when every parameter is on the CPU or a CUDA device (one pass over the
parameters instead of a dozen, four times faster for DETR-R50 on the CPU).

The schedule (:class:`LrSchedule`): an optional linear warm-up per iteration
over the first ``train.warmup_iters`` iterations, then StepLR, which
multiplies every learning rate by ``train.lr_gamma`` every ``train.lr_drop``
epochs. In training, :class:`~detr_peg.engine.hooks.LrScheduleHook` steps
both, the only place that does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from detr_peg.config.schema import TrainConfig
from detr_peg.errors import ConfigError

#: Device types with a fused AdamW kernel.
FUSED_DEVICES = {"cpu", "cuda"}


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the named parameter groups of ``model`` (the bare detector), fused where available.

    Build it after moving ``model`` to its device.

    Raises:
        ConfigError: a negative learning rate or weight decay, or no trainable
            parameter at all.
    """
    for key in ("lr", "lr_backbone", "lr_linear_proj_mult", "weight_decay"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"train.{key} must not be negative, got {getattr(cfg, key)}.")
    groups = build_param_groups(model, cfg)
    if not groups:
        raise ConfigError("The model has no trainable parameter; check model.backbone.train and frozen_stages.")
    devices = {param.device.type for group in groups for param in group["params"]}
    return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=devices <= FUSED_DEVICES or None)


def build_param_groups(model: nn.Module, train_cfg: TrainConfig) -> list[dict]:
    """AdamW parameter groups for ``model``.

    Args:
        model: the detector itself (not a DDP or compile wrapper), so that
            parameter names start with ``backbone.``, ``transformer.``, ...
        train_cfg: ``lr``, ``lr_backbone``, ``lr_linear_proj_mult`` and
            ``lr_linear_proj_names`` are read.

    Returns:
        Non-empty groups in the order ``transformer``, ``backbone``,
        ``linear_proj``, each ``{"name": str, "params": [Parameter, ...],
        "lr": float}``; only parameters with ``requires_grad``.
    """
    names = tuple(train_cfg.lr_linear_proj_names)
    groups: dict[str, list[nn.Parameter]] = {"transformer": [], "backbone": [], "linear_proj": []}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name.startswith("backbone."):
            groups["backbone"].append(param)
        elif any(n in name for n in names):
            groups["linear_proj"].append(param)
        else:
            groups["transformer"].append(param)
    lrs = {
        "transformer": train_cfg.lr,
        "backbone": train_cfg.lr_backbone,
        "linear_proj": train_cfg.lr * train_cfg.lr_linear_proj_mult,
    }
    return [{"name": key, "params": params, "lr": lrs[key]} for key, params in groups.items() if params]


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
