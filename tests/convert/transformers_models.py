"""Small random Transformers DETR and Deformable-DETR models, saved as Transformers folders (no download).

Every model is built from a config with ``use_pretrained_backbone=False``
(timm's ResNet-18, or Transformers' own ResNet-18 through ``backbone_config``),
a 32-wide transformer with two layers, two heads and a few queries. Its
weights are then moved away from their initialisation, the frozen BatchNorm
statistics included, so that every weight shapes the outputs (a swapped or
missing key changes them), and it is written with ``save_pretrained``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.utils.logging.disable_progress_bar()  # no "Writing model shards" / "Loading weights" bars on stderr

#: ``id2label`` in the COCO style: id 0 unused ("N/A"), then the synthetic shapes' category ids 1..4.
SCALE = 0.2
ID2LABEL = {0: "N/A", 1: "circle", 2: "square", 3: "triangle", 4: "cross"}

SMALL = dict(
    use_pretrained_backbone=False,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    id2label=ID2LABEL,
)


def resnet18_config(*stages: int):
    """Transformers' own ResNet-18 (``ResNetBackbone``), returning the given stages."""
    return transformers.ResNetConfig(
        depths=[2, 2, 2, 2],
        hidden_sizes=[64, 128, 256, 512],
        layer_type="basic",
        out_features=[f"stage{s}" for s in stages],
    )


def backbone_kwargs(backbone: str, *stages: int) -> dict:
    """``timm:<name>`` (timm through Transformers' ``TimmBackbone``) or ``resnet`` (Transformers' ResNet-18)."""
    if backbone == "resnet":
        return dict(use_timm_backbone=False, backbone_config=resnet18_config(*stages))
    return dict(use_timm_backbone=True, backbone=backbone.removeprefix("timm:"))


def detr_model(*, backbone: str = "timm:resnet18", seed: int = 0, **options):
    """A random ``DetrForObjectDetection`` (8 queries), its weights moved off their initialisation."""
    config = transformers.DetrConfig(num_queries=8, **SMALL, **backbone_kwargs(backbone, 4), **options)
    return _randomised(transformers.DetrForObjectDetection(config), seed)


def deformable_model(*, backbone: str = "timm:resnet18", seed: int = 0, **options):
    """A random ``DeformableDetrForObjectDetection`` (8 queries or proposals, 2 sampling points)."""
    config = transformers.DeformableDetrConfig(
        num_queries=8,
        two_stage_num_proposals=8,
        encoder_n_points=2,
        decoder_n_points=2,
        **SMALL,
        **backbone_kwargs(backbone, 2, 3, 4),
        **options,
    )
    return _randomised(transformers.DeformableDetrForObjectDetection(config), seed)


def _randomised(model, seed: int):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(SCALE * torch.randn(param.shape, generator=generator))
        for name, buffer in model.named_buffers():
            noise = torch.randn(buffer.shape, generator=generator)
            if name.endswith("running_var"):
                buffer.copy_(1.0 + 0.4 * noise.tanh())
            elif name.endswith(("running_mean", ".bias")):
                buffer.copy_(0.1 * noise)
            elif name.endswith(".weight"):
                buffer.copy_(1.0 + 0.1 * noise)
    return model.eval()


def save(model, folder: Path) -> Path:
    """``model.save_pretrained(folder)``; returns the folder."""
    model.save_pretrained(folder)
    return folder


def load(folder: Path):
    """The model of a Transformers folder, as Transformers loads it."""
    return transformers.AutoModelForObjectDetection.from_pretrained(folder).eval()


#: The parity cases: how to build each model, and the backbone source, name and encoding it converts to.
CASES = {
    "detr": (lambda: detr_model(), ("torchvision", "resnet18", "sine")),
    "detr-resnet-learned": (
        lambda: detr_model(backbone="resnet", position_embedding_type="learned"),
        ("torchvision", "resnet18", "learned"),
    ),
    "deformable": (lambda: deformable_model(backbone="resnet"), ("torchvision", "resnet18", "sine")),
    "deformable-refine": (
        lambda: deformable_model(backbone="timm:resnet18d", with_box_refine=True, position_embedding_type="learned"),
        ("timm", "resnet18d", "learned"),
    ),
    "deformable-two-stage": (
        lambda: deformable_model(with_box_refine=True, two_stage=True),
        ("torchvision", "resnet18", "sine"),
    ),
}
