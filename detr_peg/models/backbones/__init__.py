"""Backbones, chosen by ``model.backbone.source`` from :data:`BACKBONES`."""

from detr_peg.models.backbones import (
    resnet,  # noqa: F401  (registers "torchvision")
    timm_backbone,  # noqa: F401  (registers "timm")
)
from detr_peg.models.backbones.base import Backbone
from detr_peg.models.backbones.registry import BACKBONES


def build_backbone(cfg, out_stages):
    """Build the backbone named by ``cfg.source`` (see :data:`BACKBONES` for the contract)."""
    return BACKBONES.build(cfg.source, Backbone, cfg, out_stages)


__all__ = ["BACKBONES", "Backbone", "build_backbone"]
