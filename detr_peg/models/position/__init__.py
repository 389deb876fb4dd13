"""Positional encodings by ``model.position.name``; every module here registers itself on import, so an
encoding is one new file (a plug-in may extend ``__path__`` and call :func:`discover_encodings`).
"""

from __future__ import annotations

import importlib
import pkgutil

from detr_peg.models.position.base import PositionalEncoding
from detr_peg.models.position.learned import LearnedOptions, LearnedPositionalEncoding
from detr_peg.models.position.none import NoPositionalEncoding
from detr_peg.models.position.peg import PEG, PEGEncoding, PEGOptions, masked_batch_norm
from detr_peg.models.position.registry import POSITION_ENCODINGS, build_position_encoding, register_encoding
from detr_peg.models.position.sine import SineOptions, SinePositionalEncoding

#: Modules of this package that define no encoding.
INFRASTRUCTURE = frozenset({"base", "registry"})


def discover_encodings() -> list[str]:
    """Import every encoding module on this package's ``__path__``; returns the sorted names (re-imports are no-ops)."""
    names = sorted({info.name for info in pkgutil.iter_modules(__path__)} - INFRASTRUCTURE)
    for name in names:
        importlib.import_module(f"{__name__}.{name}")
    return names


# The modules above are the built-in encodings with public classes; this also imports any other one.
discover_encodings()

__all__ = [
    "PEG",
    "POSITION_ENCODINGS",
    "LearnedOptions",
    "LearnedPositionalEncoding",
    "NoPositionalEncoding",
    "PEGEncoding",
    "PEGOptions",
    "PositionalEncoding",
    "SineOptions",
    "SinePositionalEncoding",
    "build_position_encoding",
    "discover_encodings",
    "masked_batch_norm",
    "register_encoding",
]
