"""torchvision ResNet backbones (``model.backbone.source: torchvision``)."""

from __future__ import annotations

import torchvision
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d

from detr_peg.config.schema import BackboneConfig
from detr_peg.errors import ConfigError
from detr_peg.models.backbones.base import MEMORY_FORMATS, Backbone
from detr_peg.models.backbones.registry import BACKBONES
from detr_peg.models.backbones.resnet_forward import stage_forward, stem_forward
from detr_peg.models.backbones.weights import download_error, load_backbone_weights

RESNETS = (
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "resnext50_32x4d",
    "resnext101_32x8d",
    "resnext101_64x4d",
    "wide_resnet50_2",
    "wide_resnet101_2",
)

NORM_LAYERS = {"frozen_bn": FrozenBatchNorm2d, "bn": nn.BatchNorm2d, "sync_bn": nn.BatchNorm2d}


class ResNetBackbone(Backbone):
    """A torchvision ResNet cut after its last used stage, returning the 1-based ``out_stages`` (ascending).

    The body keeps torchvision's module names, so torchvision and official DETR weights load with plain
    key prefixes; ``fc``, ``avgpool`` and later stages are removed. Raises ConfigError for bad ``out_stages``.
    """

    def __init__(self, *, body: torchvision.models.ResNet, out_stages: list[int]) -> None:
        super().__init__()
        if not out_stages or sorted(set(out_stages)) != list(out_stages) or not set(out_stages) <= {1, 2, 3, 4}:
            raise ConfigError(f"model.backbone.out_stages must be ascending stage numbers in 1..4, got {out_stages}.")
        last = max(out_stages)
        for name in ("fc", "avgpool", *[f"layer{s}" for s in range(last + 1, 5)]):
            delattr(body, name)
        self.body = body
        self.out_stages = list(out_stages)
        dilated = last == 4 and body.layer4[-1].conv2.dilation != (1, 1)
        self.out_channels = [_stage_channels(getattr(body, f"layer{s}")) for s in out_stages]
        self.strides = [16 if (s == 4 and dilated) else 2 ** (s + 1) for s in out_stages]

    def forward(self, images: Tensor) -> list[Tensor]:
        # Frozen BatchNorm runs in place (see resnet_forward); bit-identical results.
        x = stem_forward(self.body, self.to_memory_format(images))
        outs = []
        for stage in range(1, self.out_stages[-1] + 1):
            x = stage_forward(getattr(self.body, f"layer{stage}"), x)
            if stage in self.out_stages:
                outs.append(x)
        return outs


def _stage_channels(layer: nn.Sequential) -> int:
    block = layer[-1]
    conv = block.conv3 if hasattr(block, "conv3") else block.conv2
    return conv.out_channels


def freeze_stages(body: nn.Module, frozen_stages: int, train: bool) -> None:
    """Disable gradients of the stem and the first ``frozen_stages`` stages (all if not ``train``)."""
    trainable = {f"layer{s}" for s in range(max(frozen_stages, 0) + 1, 5)} if train else set()
    if train and frozen_stages <= 0:
        trainable |= {"conv1", "bn1", "layer1"}
    for name, param in body.named_parameters():
        if name.split(".")[0] not in trainable:
            param.requires_grad_(False)


def pretrained_state(name: str) -> dict[str, Tensor]:
    """torchvision's ImageNet weights of ``name`` (cached by torch hub); a failed download raises CheckpointError."""
    weights = torchvision.models.get_model_weights(name).DEFAULT
    try:
        # What torchvision.models.get_model(name, weights=...) loads, with the download's errors caught.
        return weights.get_state_dict(progress=True, check_hash=True)
    except (OSError, ValueError, RuntimeError) as exc:  # URLError is an OSError; a bad hash a RuntimeError
        raise download_error(f"torchvision's ImageNet weights of {name} ({weights.url})", exc) from None


@BACKBONES.register("torchvision")
def build_resnet_backbone(cfg: BackboneConfig, out_stages: list[int]) -> ResNetBackbone:
    """Build a torchvision ResNet backbone from ``cfg``; raises ConfigError for a name not in :data:`RESNETS`."""
    if cfg.name not in RESNETS:
        valid = ", ".join(repr(n) for n in RESNETS)
        timm_name = cfg.name.removeprefix("timm:").removeprefix("timm/")
        raise ConfigError(f"Unknown torchvision backbone {cfg.name!r}: valid are {valid}; for a timm model, set "
                          f"model.backbone.source=timm and model.backbone.name={timm_name}.")  # fmt: skip
    if cfg.dilation and cfg.name in ("resnet18", "resnet34"):  # torchvision's BasicBlock raises NotImplementedError
        raise ConfigError(
            f"model.backbone.dilation=true needs a bottleneck ResNet (resnet50 and larger), not {cfg.name!r}."
        )
    if cfg.frozen_stages > 4:
        raise ConfigError(f"model.backbone.frozen_stages={cfg.frozen_stages}: {cfg.name} has 4 stages (4 freezes "
                          "them all, as model.backbone.train=false does).")  # fmt: skip
    body = torchvision.models.get_model(
        cfg.name, replace_stride_with_dilation=[False, False, cfg.dilation], norm_layer=NORM_LAYERS[cfg.norm]
    )
    if cfg.weights == "pretrained":
        body.load_state_dict(pretrained_state(cfg.name))
    backbone = ResNetBackbone(body=body, out_stages=out_stages)
    backbone.set_memory_format(MEMORY_FORMATS[cfg.memory_format])
    if cfg.weights not in (None, "pretrained"):
        ignore = ("fc.", *[f"layer{s}." for s in range(max(out_stages) + 1, 5)])
        load_backbone_weights(backbone.body, cfg.weights, ignore_prefixes=ignore)
    freeze_stages(backbone.body, cfg.frozen_stages, cfg.train)
    return backbone
