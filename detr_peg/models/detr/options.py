"""The config fields only DETR has (``model.transformer.pre_norm``, ``loss.eos_coef``); either with
``model.arch=deformable_detr`` is a config error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from detr_peg.config.ranges import valid
from detr_peg.config.schema import LossConfig, TransformerConfig


@dataclass
class DetrTransformerConfig(TransformerConfig):
    """``model.transformer`` of DETR; ``pre_norm``: LayerNorm before each block instead of after."""

    pre_norm: bool = False


@dataclass
class DetrLossConfig(LossConfig):
    """``loss`` of DETR; ``eos_coef``: relative weight of the "no object" class in the cross-entropy."""

    eos_coef: float = field(default=0.1, metadata=valid(0))


OPTIONS: dict[str, type] = {"model.transformer": DetrTransformerConfig, "loss": DetrLossConfig}

#: The dataclass defaults of the shared sections are the official DETR values.
DEFAULTS: dict[str, Any] = {}
