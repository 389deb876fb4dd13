"""Deformable-DETR (fundamentalvision/Deformable-DETR) with pluggable positional encodings."""

from detr_peg.models.deformable.build import (
    build_deformable_criterion,
    build_deformable_detr,
    build_deformable_postprocessor,
)
from detr_peg.models.deformable.deformable_detr import DeformableDETR, InputProjection
from detr_peg.models.deformable.ms_deform_attn import MSDeformAttn
from detr_peg.models.deformable.transformer import DeformableTransformer, DeformableTransformerOutput

__all__ = [
    "DeformableDETR",
    "DeformableTransformer",
    "DeformableTransformerOutput",
    "InputProjection",
    "MSDeformAttn",
    "build_deformable_criterion",
    "build_deformable_detr",
    "build_deformable_postprocessor",
]
