"""Deformable-DETR building blocks against direct computations, options and config errors."""

from __future__ import annotations

import math

import pytest
import torch

from detr_peg.errors import ConfigError
from detr_peg.models import build_criterion, build_postprocessor
from detr_peg.models.deformable.build import default_out_stages
from detr_peg.models.deformable.decoder import inverse_sigmoid, refine_reference
from detr_peg.models.deformable.levels import encoder_reference_points, flatten_levels, valid_ratio
from detr_peg.models.deformable.proposals import encoder_proposals, proposal_pos_embed
from tests.models.deformable.small_model import images_of_different_sizes, small_model, small_targets


def _masks(shapes, valid):
    """Per level masks for two images; image 1 is valid on ``valid[l]`` = (h, w) of level l."""
    masks = []
    for (h, w), (vh, vw) in zip(shapes, valid):
        m = torch.ones(2, h, w, dtype=torch.bool)
        m[0] = False
        m[1, :vh, :vw] = False
        masks.append(m)
    return masks


SHAPES = [(6, 7), (3, 4), (2, 2)]
VALID = [(4, 5), (2, 3), (1, 2)]


def test_layout_and_valid_ratios_in_w_h_order():
    masks = _masks(SHAPES, VALID)
    srcs = [torch.randn(2, 8, h, w) for h, w in SHAPES]
    tokens, layout = flatten_levels(srcs, masks)
    assert tokens.shape == (2, 42 + 12 + 4, 8)
    torch.testing.assert_close(tokens[:, 42:54], srcs[1].flatten(2).transpose(1, 2), rtol=0, atol=0)
    assert layout.shapes == SHAPES and sum(layout.sizes) == 58
    assert torch.equal(layout.spatial_shapes, torch.tensor(SHAPES))
    assert torch.equal(layout.level_start_index, torch.tensor([0, 42, 54]))
    assert torch.equal(layout.mask, torch.cat([m.flatten(1) for m in masks], 1))
    expected = torch.tensor([[[1.0, 1.0]] * 3, [[vw / w, vh / h] for (h, w), (vh, vw) in zip(SHAPES, VALID)]])
    torch.testing.assert_close(layout.valid_ratios, expected)
    torch.testing.assert_close(valid_ratio(masks[0]), expected[:, 0])


def test_encoder_reference_points_match_a_direct_computation():
    masks = _masks(SHAPES, VALID)
    _, layout = flatten_levels([torch.zeros(2, 1, h, w) for h, w in SHAPES], masks)
    refs = encoder_reference_points(layout)
    assert refs.shape == (2, 58, 3, 2)
    ratios = layout.valid_ratios
    for b in range(2):
        token = 0
        for lvl, (h, w) in enumerate(SHAPES):
            vw, vh = ratios[b, lvl].tolist()
            for i in range(h):
                for j in range(w):
                    # the pixel centre relative to the unpadded image, then onto every padded level
                    x, y = (j + 0.5) / (vw * w), (i + 0.5) / (vh * h)
                    expected = torch.tensor([[x * ratios[b, k, 0], y * ratios[b, k, 1]] for k in range(3)])
                    torch.testing.assert_close(refs[b, token], expected)
                    token += 1


def test_encoder_proposals_are_pixel_boxes_with_inf_where_invalid():
    masks = _masks(SHAPES, VALID)
    _, layout = flatten_levels([torch.zeros(2, 1, h, w) for h, w in SHAPES], masks)
    proposals, valid = encoder_proposals(layout)
    assert proposals.shape == (2, 58, 4) and valid.shape == (2, 58, 1)
    token = 0
    for lvl, (h, w) in enumerate(SHAPES):
        for i in range(h):
            for j in range(w):
                for b in range(2):
                    vh, vw = (h, w) if b == 0 else VALID[lvl]
                    box = torch.tensor([(j + 0.5) / vw, (i + 0.5) / vh, 0.05 * 2**lvl, 0.05 * 2**lvl])
                    ok = bool(((box > 0.01) & (box < 0.99)).all()) and not bool(layout.mask[b, token])
                    assert bool(valid[b, token]) == bool(((box > 0.01) & (box < 0.99)).all())
                    if ok:
                        torch.testing.assert_close(proposals[b, token], torch.log(box / (1 - box)))
                    else:
                        assert torch.isinf(proposals[b, token]).all() and (proposals[b, token] > 0).all()
                token += 1
    assert torch.isinf(proposals[1][layout.mask[1]]).all()


def test_proposal_embedding_is_sine_over_each_coordinate():
    boxes = torch.randn(2, 3, 4)
    emb = proposal_pos_embed(boxes, 8)
    assert emb.shape == (2, 3, 32)
    coord = boxes[1, 2, 3].sigmoid() * 2 * math.pi
    freqs = torch.tensor([10000 ** (2 * (k // 2) / 8) for k in range(8)])
    expected = torch.stack([(coord / freqs[0::2]).sin(), (coord / freqs[1::2]).cos()], -1).flatten()
    torch.testing.assert_close(emb[1, 2, 24:], expected)


def test_refine_reference_in_logit_space():
    delta = torch.randn(5, 4)
    points, boxes = torch.rand(5, 2), torch.rand(5, 4)
    torch.testing.assert_close(refine_reference(delta, boxes), delta + torch.logit(boxes, eps=1e-5))
    out = refine_reference(delta, points)
    torch.testing.assert_close(out[:, :2], delta[:, :2] + torch.logit(points, eps=1e-5))
    torch.testing.assert_close(out[:, 2:], delta[:, 2:], rtol=0, atol=0)
    assert torch.isfinite(inverse_sigmoid(torch.tensor([0.0, 1.0]))).all()


def test_default_backbone_stages():
    assert default_out_stages(1) == [4]
    assert default_out_stages(2) == [3, 4]
    assert default_out_stages(4) == [2, 3, 4]
    assert default_out_stages(5) == [2, 3, 4]


@pytest.mark.parametrize("levels", [1, 5])
def test_other_level_counts(levels):
    model = small_model(f"model.transformer.num_feature_levels={levels}").eval()
    assert len(model.input_proj) == levels
    assert len(model.backbone.out_channels) == min(levels, 3)
    if levels == 5:
        assert model.input_proj[4].conv.in_channels == 32 and model.input_proj[3].conv.in_channels == 512
    with torch.no_grad():
        out = model(images_of_different_sizes())
    assert out["pred_boxes"].shape == (2, 6, 4)


def test_heads_are_shared_without_refinement_and_per_layer_with_it():
    plain = small_model()
    assert plain.class_embed[0] is plain.class_embed[1] and plain.bbox_embed[0] is plain.bbox_embed[1]
    assert "class_embed.1.weight" in plain.state_dict()  # the official alias layout
    assert len([n for n, _ in plain.named_parameters() if n.startswith("class_embed.")]) == 2
    torch.testing.assert_close(plain.class_embed[0].bias, torch.full((5,), -math.log(99)))
    torch.testing.assert_close(plain.bbox_embed[0].layers[-1].bias, torch.tensor([0.0, 0.0, -2.0, -2.0]))

    refine = small_model("model.with_box_refine=true")
    assert len(refine.class_embed) == 2 and refine.class_embed[0] is not refine.class_embed[1]
    torch.testing.assert_close(refine.bbox_embed[0].layers[-1].bias, torch.tensor([0.0, 0.0, -2.0, -2.0]))
    torch.testing.assert_close(refine.bbox_embed[1].layers[-1].bias, torch.zeros(4))

    two_stage = small_model("model.with_box_refine=true", "model.two_stage=true")
    assert len(two_stage.class_embed) == 3 and not hasattr(two_stage, "query_embed")
    assert all(torch.equal(h.layers[-1].bias, torch.zeros(4)) for h in two_stage.bbox_embed)
    assert {"enc_output.weight", "pos_trans.weight"} <= {n for n, _ in two_stage.transformer.named_parameters()}


def test_two_stage_trains_and_caps_proposals_at_the_token_count():
    model = small_model(
        "model.with_box_refine=true", "model.two_stage=true", "model.transformer.two_stage_num_proposals=500"
    ).train()
    images = [torch.randn(3, 40, 48), torch.randn(3, 32, 64)]
    out = model(images)
    tokens = out["enc_outputs"]["pred_logits"].shape[1]
    assert tokens < 500 and out["pred_logits"].shape == (2, tokens, 5)
    criterion = build_criterion(model.config)
    losses = criterion(out, small_targets())
    assert {"loss_ce_enc", "loss_bbox_enc", "loss_giou_enc"} <= set(criterion.weight_dict) & set(losses)
    criterion.weighted_total(losses).backward()
    for name, p in model.named_parameters():
        if p.requires_grad and not name.startswith("backbone."):
            assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_refinement_detaches_references_between_layers():
    model = small_model("model.with_box_refine=true").train()
    captured = {}
    model.transformer.register_forward_hook(lambda m, i, o: captured.update(out=o))
    model(images_of_different_sizes())
    out = captured["out"]
    assert out.init_reference.shape[-1] == 2 and out.inter_references.shape[-1] == 4
    assert out.init_reference.requires_grad and not out.inter_references.requires_grad


def test_topk_postprocess_follows_num_select():
    model = small_model("eval.num_select=7").eval()
    with torch.no_grad():
        out = model(images_of_different_sizes())
    results = build_postprocessor(model.config)(out, torch.tensor([[100, 200], [300, 150]]))
    assert [len(r["scores"]) for r in results] == [7, 7]
    scores = out["pred_logits"].sigmoid().flatten(1)
    torch.testing.assert_close(results[0]["scores"], scores[0].topk(7).values)
    assert (results[1]["boxes"][:, 0::2] <= 150 + 1e-3).all()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.two_stage=true"], "model.two_stage needs model.with_box_refine"),
        (["model.transformer.hidden_dim=48", "model.transformer.nheads=2"], "multiple of 32"),
        (["model.transformer.nheads=3"], "not divisible"),
        (["model.backbone.out_stages=[2,3,4]", "model.transformer.num_feature_levels=2"], "out_stages"),
        (["model.transformer.enc_n_points=0"], "enc_n_points"),
    ],
)
def test_invalid_configs_are_clear_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        small_model(*overrides)


def test_a_flop_counter_runs_the_model_under_no_grad() -> None:
    """Views of the query embedding made under no_grad tripped torch's module hooks (FlopCounterMode asserted)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = small_model().eval()
    with torch.no_grad():
        plain = model(images_of_different_sizes())
        with FlopCounterMode(display=False) as counter:
            counted = model(images_of_different_sizes())
    torch.testing.assert_close(counted["pred_logits"], plain["pred_logits"], rtol=0, atol=0)
    assert counter.get_total_flops() > 0
