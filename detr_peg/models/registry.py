"""The model-architecture registry: one :class:`Architecture` per detector family; no code outside
:mod:`detr_peg.models` tests an architecture's name. A family's model takes ``(images [B, 3, H, W],
mask [B, H, W] bool, True = padding)``, returns at least ``pred_logits`` ``[B, Q, C]`` and
``pred_boxes`` ``[B, Q, 4]`` (cxcywh normalised to each unpadded image), and has ``size_divisibility``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from detr_peg.config.options import ArchitectureSchema, register_architecture_schema
from detr_peg.config.schema import Config, ModelConfig
from detr_peg.registry import Registry


@dataclass(frozen=True)
class AttentionImpls:
    """A family's attention layer class (settable ``impl``), its impls for ``bench --gpu``, ONNX export, FLOP counts."""

    module: type
    compared_on_gpu: tuple[str, ...] = ()
    export: str | None = None
    flop_count: str | None = None


@dataclass(frozen=True)
class OfficialCode:
    """Where a family's official implementation lives and how to build it from a local checkout.

    ``marker`` is a file every checkout has; ``build(path, argv, cuda_op)`` returns the official
    ``(model, criterion, args)``, with ``cuda_op`` building its compiled op instead of a pure-PyTorch path.
    """

    repository: str
    marker: str
    build: Callable[[str, list[str], bool], tuple[nn.Module, nn.Module, Any]]
    gpu_label: str = "official"


@dataclass(frozen=True)
class Architecture:
    """Everything that differs between detector families.

    ``options`` maps a dotted section path to a dataclass extending that section with the family's own
    fields (another family's field is a config error); ``defaults`` are nested ``{section: {key: value}}``
    that differ from official DETR; ``detectron2_name`` names the detectron2 meta-architecture building
    this family only, or None.
    """

    build_model: Callable[[ModelConfig], nn.Module]
    build_criterion: Callable[[Config], nn.Module]
    build_postprocessor: Callable[[Config], nn.Module]
    options: Mapping[str, type] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    attention: AttentionImpls | None = None
    official: OfficialCode | None = None
    detectron2_name: str | None = None


MODELS: Registry = Registry(
    "model architecture",
    """Detector families by ``model.arch``; each entry is an :class:`Architecture`.

    Register with :func:`register_architecture`, which also gives the config
    loader the family's fields and defaults.
    """,
)


def register_architecture(name: str, architecture: Architecture) -> Architecture:
    """Register ``architecture`` as ``model.arch: name``, with its config schema."""
    if not isinstance(architecture, Architecture):
        raise TypeError(
            f"register_architecture({name!r}, ...) takes an Architecture, got {type(architecture).__name__}."
        )
    register_architecture_schema(
        name, ArchitectureSchema(sections=architecture.options, defaults=architecture.defaults)
    )
    return MODELS.register(name)(architecture)


def _switchable_layers(model: nn.Module) -> list[tuple[nn.Module, AttentionImpls]]:
    kinds = [a.attention for a in (MODELS.get(name) for name in MODELS.names()) if a.attention is not None]
    return [(m, kind) for m in model.modules() for kind in kinds if isinstance(m, kind.module)]


def set_attention_impl(
    model: nn.Module, choose: str | Callable[[AttentionImpls], str | None]
) -> list[tuple[nn.Module, str]]:
    """Switch every switchable attention layer to ``choose`` (a name, or a function of :class:`AttentionImpls`).

    Returns ``(layer, previous impl)`` of every layer found.
    """
    previous = []
    for layer, kind in _switchable_layers(model):
        previous.append((layer, layer.impl))
        impl = choose(kind) if callable(choose) else choose
        if impl is not None:
            layer.impl = impl
    return previous


@contextlib.contextmanager
def attention_impl(model: nn.Module, choose: str | Callable[[AttentionImpls], str | None]) -> Iterator[None]:
    """:func:`set_attention_impl` for the duration of a ``with`` block."""
    previous = set_attention_impl(model, choose)
    try:
        yield
    finally:
        for layer, impl in previous:
            layer.impl = impl
