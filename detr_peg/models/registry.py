"""The model-architecture registry: one registration per detector family, carrying everything the rest of
the package needs to know about it.

A family's registration (:class:`Architecture`) names its builders (model,
criterion, post-processor), its config fields and defaults, its switchable
attention implementations (:class:`AttentionImpls`: what ``bench --gpu``
compares, what the ONNX export and the FLOP count use) and its official
counterpart (:class:`OfficialCode`: what ``bench --official`` builds). No code
outside :mod:`detr_peg.models` tests an architecture's name or its modules'
attributes; it asks the registration. The model a family builds follows one
contract: ``model(images Tensor[B, 3, H, W], mask Tensor[B, H, W] bool (True =
padding))`` returns at least ``pred_logits`` ``Tensor[B, Q, C]`` and
``pred_boxes`` ``Tensor[B, Q, 4]`` (normalised cx, cy, w, h relative to each
unpadded image), and ``model.size_divisibility`` is the multiple of pixels
its padded batches should have (its coarsest stride).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from detr_peg.config.options import ArchitectureSchema, register_architecture_schema
from detr_peg.config.schema import Config
from detr_peg.registry import Registry


@dataclass(frozen=True)
class AttentionImpls:
    """A family's attention layers with switchable implementations (an ``impl`` attribute).

    Attributes:
        module: the layer class (instances have a settable ``impl``).
        compared_on_gpu: the implementations ``bench --gpu`` times side by side.
        export: the implementation the ONNX export traces.
        flop_count: the implementation FLOPs are counted with (one whose
            operations torch's FLOP counter counts as the work they do).
    """

    module: type
    compared_on_gpu: tuple[str, ...] = ()
    export: str | None = None
    flop_count: str | None = None


@dataclass(frozen=True)
class OfficialCode:
    """Where a family's official implementation lives, and how to build it from a local checkout.

    Attributes:
        repository: ``owner/name`` on GitHub.
        marker: a file every checkout has (checked before anything is imported from it).
        build: ``(path, argv, cuda_op) -> (model, criterion, args)``: the official model,
            its criterion and its parsed arguments (``argv``: its command-line flags;
            ``cuda_op``: build its compiled op on this machine instead of a pure-PyTorch path).
        gpu_label: the row label of the official code in ``bench --gpu``.
    """

    repository: str
    marker: str
    build: Callable[[str, list[str], bool], tuple[nn.Module, nn.Module, Any]]
    gpu_label: str = "official"


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
        attention: the family's switchable attention layers, or None.
        official: the family's official implementation, or None.
        detectron2_name: the name of the detectron2 meta-architecture that
            builds this family only (``MODEL.META_ARCHITECTURE``), or None;
            the generic ``DetrPegModel`` builds any family.
    """

    build_model: Callable[[Config], nn.Module]
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
    """Switch every switchable attention layer of ``model`` to another implementation.

    Args:
        model: any detector (layers of every registered family are found).
        choose: the implementation, or a function of the layer's
            :class:`AttentionImpls` giving it (``lambda a: a.export``); None
            leaves a layer as it is.

    Returns:
        ``(layer, previous implementation)`` of every layer found.
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
    """:func:`set_attention_impl` for the duration of a ``with`` block; the implementations are restored on exit."""
    previous = set_attention_impl(model, choose)
    try:
        yield
    finally:
        for layer, impl in previous:
            layer.impl = impl
