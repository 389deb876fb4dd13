"""The model-architecture registry: one registration per detector family."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from detr_peg.config.options import ArchitectureSchema, register_architecture_schema
from detr_peg.config.schema import Config
from detr_peg.registry import Registry


@dataclass(frozen=True)
class Architecture:
    """Everything that differs between detector families: builders, config fields and defaults.

    Attributes:
        build_model: ``Config -> nn.Module`` (the detector).
        build_criterion: ``Config -> SetCriterion``.
        build_postprocessor: ``Config -> nn.Module`` mapping outputs and
            ``target_sizes`` to per-image detections.
        options: dotted section path -> a dataclass subclassing the shared
            section there with the family's own fields, e.g.
            ``{"model.transformer": DeformableTransformerConfig}``; a field of
            another family is a config error naming the key and the family.
        defaults: nested ``{section: {key: value}}`` of the shared fields whose
            default differs from the official DETR value.
    """

    build_model: Callable[[Config], nn.Module]
    build_criterion: Callable[[Config], nn.Module]
    build_postprocessor: Callable[[Config], nn.Module]
    options: Mapping[str, type] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)


MODELS: Registry = Registry(
    "model architecture",
    """Detector families by ``model.arch``; each entry is an :class:`Architecture`.

    Register with :func:`register_architecture`, which also gives the config
    loader the family's fields and defaults.
    """,
)


def register_architecture(name: str, architecture: Architecture) -> Architecture:
    """Register ``architecture`` as ``model.arch: name``, with its config schema."""
    register_architecture_schema(
        name, ArchitectureSchema(sections=architecture.options, defaults=architecture.defaults)
    )
    return MODELS.register(name)(architecture)
