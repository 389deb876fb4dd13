"""Conversion of official DETR and Deformable-DETR checkpoints and of Transformers checkpoint folders.

Names are imported lazily, so ``import detr_peg.convert.source_kind`` (which
converter reads a source, and whether it is there) does not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ConversionReport": "detr_peg.convert.report",
    "convert_checkpoint": "detr_peg.convert.sources",
    "convert_file": "detr_peg.convert.sources",
    "convert_official": "detr_peg.convert.official",
    "convert_official_file": "detr_peg.convert.official",
    "convert_transformers": "detr_peg.convert.transformers_folder",
    "convert_transformers_file": "detr_peg.convert.transformers_folder",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'detr_peg.convert' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
