"""Rebuilding a model from a detr_peg checkpoint: :func:`load_model` (``detr_peg.load_model``).

A checkpoint stores its resolved config and the whole model state dict,
backbone included (see :mod:`detr_peg.checkpoint.format`), so the model is
built from the stored config with :func:`without_backbone_weights` (nothing
is read from ``model.backbone.weights``) and then given the stored weights.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace

import torch
from torch import nn

from detr_peg.checkpoint.format import load_weights, read_checkpoint
from detr_peg.config.loader import config_to_dict, load_config
from detr_peg.config.schema import Config
from detr_peg.models.builder import build_model


def without_backbone_weights(cfg: Config) -> Config:
    """``cfg`` whose backbone starts from random weights (``model.backbone.weights=None``).

    For every model whose weights come from elsewhere afterwards (a detr_peg
    checkpoint, a resumed run, converted official weights), so building it
    reads no backbone file and downloads nothing.
    """
    return replace(cfg, model=replace(cfg.model, backbone=replace(cfg.model.backbone, weights=None)))


def load_model(
    path: str | os.PathLike, *, device: str | torch.device = "cpu", overrides: Iterable[str] = ()
) -> nn.Module:
    """Rebuild the model stored in a detr_peg checkpoint, ready for inference.

    Args:
        path: checkpoint file (``.pth`` or ``.safetensors``), or URL.
        device: where to put the model.
        overrides: ``key=value`` config changes that do not alter weights
            (for example ``eval.num_select=50``).

    Returns:
        The model in eval mode, with attributes ``config`` (the resolved
        :class:`Config`) and ``label_map`` (plain dict or None).

    Raises:
        CheckpointError: unreadable or unsafe file, not a detr_peg
            checkpoint, or weights that do not fit the stored config.
    """
    ckpt = read_checkpoint(path)
    cfg = ckpt.config
    if overrides:
        cfg = load_config(None, overrides, base=config_to_dict(cfg), base_source=f"config stored in {path}")
    # The checkpoint holds the backbone weights; do not load them from elsewhere.
    cfg = without_backbone_weights(cfg)
    model = build_model(cfg)
    load_weights(model, ckpt.model, f"Checkpoint {path}")
    model.config = cfg
    model.label_map = ckpt.label_map
    return model.to(device).eval()
