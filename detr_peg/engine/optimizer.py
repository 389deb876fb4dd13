"""AdamW over named parameter groups (``transformer``, ``backbone``, ``linear_proj``) and its learning-rate schedule."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from detr_peg.config.schema import TrainConfig
from detr_peg.errors import ConfigError

#: Device types with a fused AdamW kernel.
FUSED_DEVICES = {"cpu", "cuda"}


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over :func:`build_param_groups`, fused on CPU and CUDA; build it after moving ``model`` to its device.

    Raises:
        ConfigError: a negative learning rate or weight decay, or no trainable parameter.
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
    """Non-empty groups ``{"name", "params", "lr"}`` of the trainable parameters of the bare detector (not a wrapper).

    ``transformer`` (the rest) at ``lr``; ``backbone`` (``backbone.*``) at ``lr_backbone``; ``linear_proj`` (names
    containing one of ``lr_linear_proj_names``) at ``lr * lr_linear_proj_mult``. No parameter is in two groups.
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

    Both are chainable torch schedulers, so a drop inside the warm-up still applies; the warm-up rises from
    ``WARMUP_START_FACTOR`` times each rate over ``warmup_iters`` (0: none).
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
        """Restore a :meth:`state_dict` (or the bare StepLR state of older checkpoints)."""
        if "drop" not in state:
            self.drop.load_state_dict(state)
            return
        self.drop.load_state_dict(state["drop"])
        if self.warmup is not None and state.get("warmup") is not None:
            self.warmup.load_state_dict(state["warmup"])


def build_lr_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> LrSchedule:
    """The schedule of ``train.warmup_iters``, ``lr_drop``, ``lr_gamma``; ConfigError for invalid values."""
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
