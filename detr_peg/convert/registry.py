"""The registries of the formats ``detr-peg convert`` reads: official checkpoints and Transformers folders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from detr_peg.convert.key_map import KeyMap
from detr_peg.registry import Registry


@dataclass(frozen=True)
class OfficialFormat:
    """How to read one official codebase's checkpoints.

    ``infer``: ``state_dict -> (hard, soft)`` config values (hard may not be overridden differently).
    ``key_map``: official key -> detr_peg key (``None`` drops). ``args_map``: ``args`` attribute -> dotted
    key or ``value -> {key: value}``. ``complete``: ``(state_dict, config) -> {key: value}``, hard values
    needing the resolved config. ``aliases``: regexes of duplicate keys, which must equal their target.
    """

    name: str
    arch: str
    matches: Callable[[dict[str, Tensor]], bool]
    infer: Callable[[dict[str, Tensor]], tuple[dict[str, Any], dict[str, Any]]]
    key_map: KeyMap
    args_map: dict[str, Any] = field(default_factory=dict)
    complete: Callable[[dict[str, Tensor], Any], dict[str, Any]] | None = None
    #: ``hard -> [dotted key]``: values the weights do not tell, needed from ``args``, a config file or overrides.
    untold: Callable[[dict[str, Any]], list[str]] | None = None


OFFICIAL_FORMATS: Registry = Registry(
    "official checkpoint format",
    """Official checkpoint formats by codebase name; each entry is an :class:`OfficialFormat`.""",
    builtins=("detr_peg.convert.detr", "detr_peg.convert.deformable"),
)


@dataclass(frozen=True)
class TransformersFormat:
    """How to read one Transformers model class's checkpoints.

    ``read``: ``(config_json, state_dict, src) -> (hard, soft)``, raising ``CheckpointError`` on an
    unrepresentable setting. ``key_map`` applies after attention projections are fused. ``fill``:
    ``(mapped_state_dict, config) -> None`` adds heads Transformers stores once.
    """

    name: str
    model_type: str
    architecture: str
    arch: str
    read: Callable[[dict[str, Any], dict[str, Tensor], str], tuple[dict[str, Any], dict[str, Any]]]
    key_map: KeyMap
    fill: Callable[[dict[str, Tensor], Any], None] | None = None


TRANSFORMERS_FORMATS: Registry = Registry(
    "Transformers model type",
    """Transformers checkpoint formats by ``model_type``; each entry is a :class:`TransformersFormat`.""",
    builtins=("detr_peg.convert.transformers_detr", "detr_peg.convert.transformers_deformable"),
)
