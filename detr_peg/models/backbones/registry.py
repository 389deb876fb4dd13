"""The backbone registry."""

from __future__ import annotations

from detr_peg.registry import Registry

BACKBONES = Registry(
    "backbone source",
    """Backbone builders by ``model.backbone.source``.

    Each entry is called as ``builder(cfg: BackboneConfig, out_stages: list[int])``
    and returns a :class:`~detr_peg.models.backbones.base.Backbone` whose
    ``forward`` yields one feature map per entry of ``out_stages`` (1-based
    stage indices, stage ``s`` at stride ``2 ** (s + 1)`` before dilation),
    with ``out_channels`` and ``strides`` set. Builders load
    ``cfg.weights`` (local path, URL or ``"pretrained"``), apply ``cfg.norm``
    and freeze the stem and the first ``cfg.frozen_stages`` stages (everything
    when ``cfg.train`` is false).
    """,
)
