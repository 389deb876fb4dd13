"""The optimizer: AdamW over named parameter groups with the official per-part learning rates.

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
"""

from __future__ import annotations

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
