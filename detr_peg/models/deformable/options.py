"""Config fields only Deformable-DETR has (official key paths), and its defaults where they differ from DETR;
any of these fields with ``model.arch=detr`` is a config error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from detr_peg.config.ranges import FLOAT, Lookup, query_memory, valid
from detr_peg.config.schema import EvalConfig, LossConfig, ModelConfig, TransformerConfig


def _levels_memory(get: Lookup) -> float:
    """One ``d x d`` input projection per feature level."""
    return FLOAT * get("model.transformer.num_feature_levels") * get("model.transformer.hidden_dim") ** 2


def _points_memory(key: str) -> Callable[[Lookup], float]:
    def memory(get: Lookup) -> float:
        """Sampling offsets and weights (3 per point) for every head and level, from ``d`` inputs."""
        t = "model.transformer."
        return (
            FLOAT
            * 3
            * get(key)
            * get(t + "nheads")
            * get(t + "num_feature_levels")
            * get(t + "hidden_dim")
            * (get(t + "enc_layers") + get(t + "dec_layers"))
        )

    return memory


def _proposals_memory(get: Lookup) -> float:
    return query_memory(get, "model.transformer.two_stage_num_proposals")


@dataclass
class DeformableModelConfig(ModelConfig):
    """``model`` of Deformable-DETR; ``two_stage`` needs ``with_box_refine``."""

    with_box_refine: bool = False
    two_stage: bool = False


@dataclass
class DeformableTransformerConfig(TransformerConfig):
    """``model.transformer`` of Deformable-DETR; two-stage, ``two_stage_num_proposals`` replaces ``num_queries``."""

    num_feature_levels: int = field(default=4, metadata=valid(1, memory=_levels_memory))
    enc_n_points: int = field(default=4, metadata=valid(1, memory=_points_memory("model.transformer.enc_n_points")))
    dec_n_points: int = field(default=4, metadata=valid(1, memory=_points_memory("model.transformer.dec_n_points")))
    two_stage_num_proposals: int = field(default=300, metadata=valid(1, memory=_proposals_memory))


@dataclass
class DeformableLossConfig(LossConfig):
    """``loss`` of Deformable-DETR (focal loss)."""

    focal_alpha: float = field(default=0.25, metadata=valid(0, 1))
    focal_gamma: float = field(default=2.0, metadata=valid(0))


@dataclass
class DeformableEvalConfig(EvalConfig):
    """``eval`` of Deformable-DETR: ``num_select`` detections kept per image (top-k over queries x classes)."""

    num_select: int = field(default=100, metadata=valid(1))


OPTIONS: dict[str, type] = {
    "model": DeformableModelConfig,
    "model.transformer": DeformableTransformerConfig,
    "loss": DeformableLossConfig,
    "eval": DeformableEvalConfig,
}

#: Where the official Deformable-DETR differs from the DETR defaults of the shared sections.
DEFAULTS: dict[str, Any] = {
    "model": {
        "num_queries": 300,
        "transformer": {"dim_feedforward": 1024},
        # The official sine encoding measures positions from pixel centres (a default only under sine).
        "position": {"offset": -0.5},
    },
    "loss": {"set_cost_class": 2.0, "ce_loss_coef": 2.0},
    "train": {"lr": 2e-4},
}
