"""Detectors, their parts and their losses."""

from detr_peg.models.builder import build_criterion, build_model, build_postprocessor

__all__ = ["build_criterion", "build_model", "build_postprocessor"]
