"""detr_peg backbones as a detectron2 ``Backbone`` (``MODEL.BACKBONE.NAME: build_detr_peg_backbone``).

Inputs are RGB normalised with ImageNet mean and std (``MODEL.PIXEL_MEAN: [123.675, 116.28, 103.53]``).
"""

from __future__ import annotations

from detectron2.layers import ShapeSpec
from detectron2.modeling import BACKBONE_REGISTRY
from detectron2.modeling import Backbone as D2Backbone
from torch import Tensor

from detr_peg.errors import ConfigError
from detr_peg.integrations.detectron2.config import STAGE_NAMES, detr_peg_config, out_feature_stages
from detr_peg.models.backbones import build_backbone
from detr_peg.models.backbones.base import Backbone


class DetrPegBackbone(D2Backbone):
    """detr_peg backbone as a detectron2 one; ``out_features`` name its levels (``res2``..), finest first."""

    def __init__(self, *, backbone: Backbone, out_features: list[str]) -> None:
        super().__init__()
        if len(out_features) != len(backbone.out_channels):
            raise ValueError(
                f"{len(out_features)} output names for a backbone with {len(backbone.out_channels)} levels"
            )
        self.backbone = backbone
        self._out_features = list(out_features)
        self._out_feature_channels = dict(zip(out_features, backbone.out_channels))
        self._out_feature_strides = dict(zip(out_features, backbone.strides))

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        """``Tensor[B, 3, H, W]`` (normalised RGB) -> ``{name: Tensor[B, C, H / stride, W / stride]}``, rounded up."""
        return dict(zip(self._out_features, self.backbone(x)))

    def output_shape(self) -> dict[str, ShapeSpec]:
        """``{name: ShapeSpec(channels=C, stride=s)}`` for every output."""
        return {
            name: ShapeSpec(channels=self._out_feature_channels[name], stride=self._out_feature_strides[name])
            for name in self._out_features
        }


@BACKBONE_REGISTRY.register()
def build_detr_peg_backbone(cfg, input_shape: ShapeSpec) -> DetrPegBackbone:
    """Build :class:`DetrPegBackbone` from ``cfg.MODEL.DETR_PEG``; ``ConfigError`` for a non-RGB input or bad names."""
    if input_shape.channels not in (None, 3):
        raise ConfigError(
            f"DetrPegBackbone takes 3-channel images, got {input_shape.channels} channels "
            "(cfg.MODEL.PIXEL_MEAN must have 3 values)."
        )
    names = list(cfg.MODEL.DETR_PEG.OUT_FEATURES)
    stages = out_feature_stages(names)
    config = detr_peg_config(cfg)
    backbone = build_backbone(config.model.backbone, stages)
    expected = [2 ** (STAGE_NAMES[n] + 1) for n in names]
    if backbone.strides != expected:
        raise ConfigError(
            f"cfg.MODEL.DETR_PEG.OUT_FEATURES {names} name strides {expected}, but the detr_peg backbone "
            f"returns strides {backbone.strides} (a dilated last stage has stride 16: drop model.backbone.dilation)."
        )
    return DetrPegBackbone(backbone=backbone, out_features=names)
