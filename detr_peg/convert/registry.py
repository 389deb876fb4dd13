"""The registries of the checkpoint formats ``detr-peg convert`` reads: official checkpoints and Transformers folders."""

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

    Attributes:
        name: the codebase, in words ("DETR").
        arch: the detr_peg ``model.arch`` it converts to.
        matches: ``state_dict -> bool``, whether a state dict is of this format.
        infer: ``state_dict -> (hard, soft)``: config values the weights
            determine (``hard``: may not be overridden differently) and values
            they suggest (``soft``: the stored args and overrides win).
        key_map: official key -> detr_peg key (``None`` drops it).
        args_map: official ``args`` attribute -> dotted config key, or a
            callable ``(value) -> {dotted key: value}``.
        complete: optional ``(state_dict, config) -> {dotted key: value}``:
            further values the weights determine once the rest of the config
            is resolved (Deformable-DETR sampling points need the number of
            heads); treated like ``hard`` values. May raise ``CheckpointError``.
        aliases: regexes of official keys that duplicate another key (shared
            modules stored twice); they must equal the key they map onto.
    """

    name: str
    arch: str
    matches: Callable[[dict[str, Tensor]], bool]
    infer: Callable[[dict[str, Tensor]], tuple[dict[str, Any], dict[str, Any]]]
    key_map: KeyMap
    args_map: dict[str, Any] = field(default_factory=dict)
    complete: Callable[[dict[str, Tensor], Any], dict[str, Any]] | None = None


OFFICIAL_FORMATS: Registry = Registry(
    "official checkpoint format",
    """Official checkpoint formats by codebase name; each entry is an :class:`OfficialFormat`.""",
    builtins=("detr_peg.convert.detr", "detr_peg.convert.deformable"),
)


@dataclass(frozen=True)
class TransformersFormat:
    """How to read one Transformers model class's checkpoints (its ``config.json`` and its weights).

    Attributes:
        name: the model class, in words ("Transformers DETR").
        model_type: the ``model_type`` of its ``config.json`` (``detr``).
        architecture: the class name its ``config.json`` lists under ``architectures``.
        arch: the detr_peg ``model.arch`` it converts to.
        read: ``(config_json, state_dict, src) -> (hard, soft)``: the config
            values its ``config.json`` and weights determine and suggest (see
            :func:`detr_peg.convert.report.resolve_layers`); refuses a setting
            detr_peg cannot represent with a ``CheckpointError`` naming the field.
        key_map: source key -> detr_peg key (after the attention projections
            are fused, see :func:`detr_peg.convert.transformers_keys.fuse_attention_projections`).
        fill: optional ``(mapped_state_dict, config) -> None``: adds the
            modules Transformers stores once and ties (shared detection heads).
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
