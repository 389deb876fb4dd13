"""Positional encodings, chosen by ``model.position.name`` from :data:`POSITION_ENCODINGS`."""

from detr_peg.models.position import learned, none, peg, sine  # noqa: F401  (register the encodings)
from detr_peg.models.position.base import PositionalEncoding
from detr_peg.models.position.learned import LearnedPositionalEncoding
from detr_peg.models.position.none import NoPositionalEncoding
from detr_peg.models.position.peg import PEG, PEGEncoding, masked_batch_norm
from detr_peg.models.position.registry import POSITION_ENCODINGS, build_position_encoding
from detr_peg.models.position.sine import SinePositionalEncoding

__all__ = [
    "PEG",
    "POSITION_ENCODINGS",
    "LearnedPositionalEncoding",
    "NoPositionalEncoding",
    "PEGEncoding",
    "PositionalEncoding",
    "SinePositionalEncoding",
    "build_position_encoding",
    "masked_batch_norm",
]
