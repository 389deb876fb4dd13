"""Conversion of official DETR and Deformable-DETR checkpoints and of Transformers checkpoint folders."""

from detr_peg.convert.official import convert_official, convert_official_file
from detr_peg.convert.report import ConversionReport
from detr_peg.convert.sources import convert_checkpoint, convert_file
from detr_peg.convert.transformers_folder import convert_transformers, convert_transformers_file

__all__ = [
    "ConversionReport",
    "convert_checkpoint",
    "convert_file",
    "convert_official",
    "convert_official_file",
    "convert_transformers",
    "convert_transformers_file",
]
