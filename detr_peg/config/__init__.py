"""Typed, composable configuration (YAML files plus ``key=value`` overrides)."""

from detr_peg.config.loader import (
    config_from_dict,
    config_to_dict,
    load_config,
    parse_overrides,
    save_config,
)
from detr_peg.config.schema import (
    BackboneConfig,
    Config,
    DataConfig,
    EvalConfig,
    LossConfig,
    ModelConfig,
    PositionConfig,
    TrainConfig,
    TransformerConfig,
)

__all__ = [
    "BackboneConfig",
    "Config",
    "DataConfig",
    "EvalConfig",
    "LossConfig",
    "ModelConfig",
    "PositionConfig",
    "TrainConfig",
    "TransformerConfig",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "parse_overrides",
    "save_config",
]
