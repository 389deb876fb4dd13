"""Small Deformable-DETR configs and inputs shared by the Deformable-DETR tests (fast on a CPU)."""

from __future__ import annotations

import torch

from detr_peg.config import Config, load_config
from detr_peg.models import build_model

SMALL = [
    "model.arch=deformable_detr",
    "model.num_classes=5",
    "model.num_queries=6",
    "model.backbone.name=resnet18",
    "model.transformer.hidden_dim=32",
    "model.transformer.nheads=2",
    "model.transformer.enc_layers=2",
    "model.transformer.dec_layers=2",
    "model.transformer.dim_feedforward=64",
    "model.transformer.enc_n_points=2",
    "model.transformer.dec_n_points=2",
    "model.transformer.two_stage_num_proposals=6",
]


def small_config(*overrides: str) -> Config:
    return load_config(None, [*SMALL, *overrides])


def small_model(*overrides: str, seed: int = 0):
    """A randomly initialised small model; ``model.config`` holds its config (as with ``load_model``)."""
    cfg = small_config(*overrides)
    torch.manual_seed(seed)
    model = build_model(cfg)
    model.config = cfg
    return model


def images_of_different_sizes(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 52, 70, generator=g), torch.randn(3, 80, 48, generator=g)]


def small_targets() -> list[dict[str, torch.Tensor]]:
    return [
        {"labels": torch.tensor([0, 3]), "boxes": torch.tensor([[0.5, 0.5, 0.3, 0.4], [0.2, 0.3, 0.1, 0.2]])},
        {"labels": torch.tensor([4]), "boxes": torch.tensor([[0.6, 0.4, 0.5, 0.5]])},
    ]
