"""Conversion of official DETR / Deformable-DETR checkpoints and Transformers folders (lazy names: no torch)."""

from __future__ import annotations

from detr_peg.lazy_exports import lazy_exports as _lazy_exports

_EXPORTS = {
    "ConversionReport": "detr_peg.convert.report",
    "convert_checkpoint": "detr_peg.convert.sources",
    "convert_file": "detr_peg.convert.sources",
    "convert_official": "detr_peg.convert.official",
    "convert_transformers": "detr_peg.convert.transformers_folder",
}

__all__, __getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
