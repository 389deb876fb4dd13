"""DETR (facebookresearch/detr) with pluggable positional encodings."""

from detr_peg.models.detr.build import build_detr, build_detr_criterion, build_detr_postprocessor
from detr_peg.models.detr.detr import DETR
from detr_peg.models.detr.transformer import Transformer

__all__ = ["DETR", "Transformer", "build_detr", "build_detr_criterion", "build_detr_postprocessor"]
