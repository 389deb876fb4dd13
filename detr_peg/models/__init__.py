"""Detectors, their parts and their losses."""

from detr_peg.models.builder import build_criterion, build_model, build_postprocessor
from detr_peg.models.loading import load_model, without_backbone_weights

__all__ = ["build_criterion", "build_model", "build_postprocessor", "load_model", "without_backbone_weights"]
