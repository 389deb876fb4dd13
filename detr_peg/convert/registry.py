"""The registry of official checkpoint formats ``detr-peg convert`` reads."""

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
)
