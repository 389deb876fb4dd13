"""AdamW over detr_peg's parameter groups for detectron2 training, with full-model gradient clipping.

Group learning rates: ``SOLVER.BASE_LR`` times ``BACKBONE_MULTIPLIER`` (backbone),
``LINEAR_PROJ_MULTIPLIER`` (deformable offsets) or 1 (the rest).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from detectron2.solver.build import maybe_add_gradient_clipping
from torch import nn

from detr_peg.config.schema import TrainConfig
from detr_peg.engine.optimizer import build_param_groups
from detr_peg.errors import ConfigError


class FullModelClippedAdamW(torch.optim.AdamW):
    """AdamW that clips the total gradient norm over all its parameters to ``max_norm`` before each step."""

    def __init__(self, params, *, max_norm: float, norm_type: float = 2.0, **kwargs) -> None:
        super().__init__(params, **kwargs)
        self.max_norm = max_norm
        self.norm_type = norm_type

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, self.max_norm, self.norm_type)
        return super().step(closure)


def build_detr_peg_optimizer(cfg, model: nn.Module) -> torch.optim.Optimizer:
    """AdamW over detr_peg's parameter groups, clipped as ``SOLVER.CLIP_GRADIENTS`` says.

    Raises ``ConfigError``: ``SOLVER.OPTIMIZER`` is not ``ADAMW``, or nothing is trainable.
    """
    solver = cfg.SOLVER
    if solver.OPTIMIZER.upper() != "ADAMW":
        raise ConfigError(f"cfg.SOLVER.OPTIMIZER {solver.OPTIMIZER!r} is not supported for DETR-PEG: use 'ADAMW'.")
    detector = getattr(model, "module", model).detector
    train_cfg = replace(
        TrainConfig(),
        lr=solver.BASE_LR,
        lr_backbone=solver.BASE_LR * solver.BACKBONE_MULTIPLIER,
        lr_linear_proj_mult=solver.LINEAR_PROJ_MULTIPLIER,
        weight_decay=solver.WEIGHT_DECAY,
    )
    groups = build_param_groups(detector, train_cfg)
    if not groups:
        raise ConfigError("The model has no trainable parameter; check model.backbone.train and frozen_stages.")
    for group in groups:
        group["weight_decay"] = solver.WEIGHT_DECAY
    clip = solver.CLIP_GRADIENTS
    if clip.ENABLED and clip.CLIP_TYPE == "full_model":
        if clip.CLIP_VALUE <= 0:
            raise ConfigError(f"cfg.SOLVER.CLIP_GRADIENTS.CLIP_VALUE must be positive, got {clip.CLIP_VALUE}.")
        return FullModelClippedAdamW(
            groups,
            max_norm=clip.CLIP_VALUE,
            norm_type=clip.NORM_TYPE,
            lr=solver.BASE_LR,
            weight_decay=solver.WEIGHT_DECAY,
        )
    return maybe_add_gradient_clipping(cfg, torch.optim.AdamW)(
        groups, lr=solver.BASE_LR, weight_decay=solver.WEIGHT_DECAY
    )
