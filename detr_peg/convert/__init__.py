"""Conversion of official DETR and Deformable-DETR checkpoints."""

from detr_peg.convert.official import ConversionReport, convert_official, convert_official_file

__all__ = ["ConversionReport", "convert_official", "convert_official_file"]
