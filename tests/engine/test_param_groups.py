"""Optimizer parameter groups: backbone, linear projections (x lr_linear_proj_mult), the rest."""

from __future__ import annotations

import torch

from detr_peg.config import load_config
from detr_peg.engine import build_param_groups
from detr_peg.models import build_model
from tests.models.deformable.small_model import small_model


def _by_name(groups):
    return {g["name"]: g for g in groups}


def test_deformable_groups_follow_the_official_learning_rates():
    model = small_model(
        "model.with_box_refine=true", "train.lr=2e-4", "train.lr_backbone=2e-5", "train.lr_linear_proj_mult=0.1"
    )
    groups = build_param_groups(model, model.config.train)
    assert [g["name"] for g in groups] == ["transformer", "backbone", "linear_proj"]
    by_name = _by_name(groups)
    assert by_name["transformer"]["lr"] == 2e-4 and by_name["backbone"]["lr"] == 2e-5
    assert abs(by_name["linear_proj"]["lr"] - 2e-5) < 1e-12

    names = {id(p): n for n, p in model.named_parameters()}
    group_of = {}
    for g in groups:
        for p in g["params"]:
            assert id(p) not in group_of, f"{names[id(p)]} is in two groups"
            group_of[id(p)] = g["name"]
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert set(group_of) == trainable
    for pid, group in group_of.items():
        name = names[pid]
        if name.startswith("backbone."):
            assert group == "backbone", name
        elif "sampling_offsets" in name or "reference_points" in name:
            assert group == "linear_proj", name
        else:
            assert group == "transformer", name
    linear = {names[id(p)] for p in by_name["linear_proj"]["params"]}
    assert "transformer.reference_points.weight" in linear
    assert "transformer.encoder.layers.0.self_attn.sampling_offsets.bias" in linear
    assert "transformer.decoder.layers.1.cross_attn.sampling_offsets.weight" in linear
    # frozen stem and first stage are left out
    assert not any(
        n.startswith(("backbone.body.conv1", "backbone.body.layer1."))
        for n in (names[id(p)] for p in by_name["backbone"]["params"])
    )
    torch.optim.AdamW(groups, lr=2e-4, weight_decay=1e-4)


def test_shared_heads_count_once_and_custom_names_apply():
    model = small_model("train.lr_linear_proj_names=[level_embed]", "train.lr_linear_proj_mult=0.5")
    groups = _by_name(build_param_groups(model, model.config.train))
    linear = groups["linear_proj"]["params"]
    assert len(linear) == 1 and linear[0] is model.transformer.level_embed
    heads = [p for p in groups["transformer"]["params"] if p is model.class_embed[0].weight]
    assert len(heads) == 1  # class_embed.0 and class_embed.1 are one module


def test_detr_has_no_linear_projection_group_and_frozen_backbone_none():
    cfg = load_config(
        None,
        [
            "model.num_classes=3",
            "model.backbone.name=resnet18",
            "model.num_queries=4",
            "model.transformer.hidden_dim=16",
            "model.transformer.nheads=2",
            "model.transformer.enc_layers=1",
            "model.transformer.dec_layers=1",
            "model.transformer.dim_feedforward=32",
            "model.backbone.train=false",
        ],
    )
    groups = build_param_groups(build_model(cfg), cfg.train)
    assert [g["name"] for g in groups] == ["transformer"]
