"""Positional encodings in Deformable-DETR: every registered encoding trains, per-level PEG properties."""

from __future__ import annotations

import pytest
import torch

from detr_peg.models import build_criterion
from detr_peg.models.deformable.levels import flatten_levels, level_positions
from detr_peg.models.position import POSITION_ENCODINGS, PEGEncoding
from tests.models.deformable.small_model import images_of_different_sizes, small_model, small_targets

NAMES = POSITION_ENCODINGS.names()


def _randomize_norms(encoding: PEGEncoding, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for layer in encoding.pegs.values():
        for peg in layer.values():
            c = peg.norm.num_features
            with torch.no_grad():
                peg.norm.running_mean.copy_(torch.rand(c, generator=g) - 0.5)
                peg.norm.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                peg.norm.weight.copy_(torch.rand(c, generator=g) + 0.5)
                peg.norm.bias.copy_(torch.rand(c, generator=g) - 0.5)


@pytest.mark.parametrize("name", NAMES)
def test_deformable_detr_with_each_encoding_trains(name):
    model = small_model(f"model.position.name={name}").train()
    # The official initialisation zeroes the projections from the queries to the sampling
    # offsets and attention weights, so at initialisation an additive encoding (which only
    # enters the queries) gets no gradient; perturb them as a few training steps would.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith(("sampling_offsets.weight", "attention_weights.weight")):
                p.normal_(0.0, 0.02)
    criterion = build_criterion(model.config)
    out = model(images_of_different_sizes())
    assert out["pred_logits"].shape == (2, 6, 5) and out["pred_boxes"].shape == (2, 6, 4)
    assert len(out["aux_outputs"]) == 1
    loss = criterion.weighted_total(criterion(out, small_targets()))
    assert torch.isfinite(loss)
    loss.backward()
    for pname, p in model.named_parameters():
        if p.requires_grad and not pname.startswith("backbone."):
            assert p.grad is not None and torch.isfinite(p.grad).all(), pname
    for pname, p in model.transformer.position.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", NAMES)
def test_two_stage_with_each_encoding_runs(name):
    model = small_model(f"model.position.name={name}", "model.with_box_refine=true", "model.two_stage=true").eval()
    with torch.no_grad():
        out = model(images_of_different_sizes())
    assert out["pred_boxes"].shape == (2, 6, 4)
    assert out["enc_outputs"]["pred_logits"].shape[:2] == out["enc_outputs"]["pred_boxes"].shape[:2]
    assert torch.isfinite(out["pred_boxes"]).all() and torch.isfinite(out["pred_logits"]).all()


def test_peg_and_none_add_only_the_level_embedding():
    model = small_model("model.position.name=peg").eval()
    transformer = model.transformer
    masks = [torch.zeros(2, 4, 5, dtype=torch.bool), torch.zeros(2, 2, 3, dtype=torch.bool)]
    masks[0][1, :, 3:] = True
    masks[1][1, :, 2:] = True
    for mask in masks:
        assert transformer.position(mask) is None
    srcs = [torch.randn(2, 32, 4, 5), torch.randn(2, 32, 2, 3)]
    _, layout = flatten_levels(srcs, masks)
    pos = level_positions([None, None], transformer.level_embed, layout)
    assert pos.shape == (26, 32)
    torch.testing.assert_close(pos[:20], transformer.level_embed[0].expand(20, -1), rtol=0, atol=0)
    torch.testing.assert_close(pos[20:], transformer.level_embed[1].expand(6, -1), rtol=0, atol=0)


def test_peg_is_applied_per_level_after_the_configured_layers():
    model = small_model("model.position.name=peg", "model.position.peg_layers=[-1,1]").eval()
    position = model.transformer.position
    assert isinstance(position, PEGEncoding) and position.num_levels == 4
    assert [position.mixes_after(i) for i in (-1, 0, 1)] == [True, False, True]
    calls = []
    original = position.mix
    position.mix = lambda layer, tokens, mask, shapes: (
        calls.append((layer, mask, list(shapes))) or original(layer, tokens, mask, shapes)
    )
    images, mask = torch.zeros(2, 3, 96, 128), torch.ones(2, 96, 128, dtype=torch.bool)
    images[0], mask[0] = torch.randn(3, 96, 128), False
    images[1, :, :64, :80], mask[1, :64, :80] = torch.randn(3, 64, 80), False
    with torch.no_grad():
        model(images, mask)
    assert [c[0] for c in calls] == [-1, 1]
    layer, token_mask, shapes = calls[0]
    assert shapes == [(12, 16), (6, 8), (3, 4), (2, 2)]
    assert token_mask.shape == (2, sum(h * w for h, w in shapes))
    assert not token_mask[0].any() and token_mask[1].any()


def test_per_level_peg_keeps_padded_tokens_and_is_padding_invariant():
    """A four-level token sequence: padded tokens unchanged; an image alone equals the image padded."""
    model = small_model("model.position.name=peg", "model.position.peg_layers=[0]").eval()
    encoding = model.transformer.position
    _randomize_norms(encoding)
    c = 32
    small_shapes = [(5, 6), (3, 3), (2, 2), (1, 1)]
    big_shapes = [(8, 9), (4, 5), (2, 3), (1, 2)]
    levels = [torch.randn(h, w, c) for h, w in small_shapes]
    alone = encoding.mix(0, torch.cat([lv.reshape(1, -1, c) for lv in levels], 1), None, small_shapes)

    tokens, masks = [], []
    for (h, w), (hb, wb), lv in zip(small_shapes, big_shapes, levels):
        grid = torch.full((2, hb, wb, c), 25.0)  # garbage in the padding must not leak in
        grid[0, :h, :w] = lv
        grid[1] = torch.randn(hb, wb, c)
        m = torch.ones(2, hb, wb, dtype=torch.bool)
        m[0, :h, :w] = False
        m[1] = False
        tokens.append(grid.flatten(1, 2))
        masks.append(m.flatten(1))
    tokens, mask = torch.cat(tokens, 1), torch.cat(masks, 1)
    out = encoding.mix(0, tokens, mask, big_shapes)
    torch.testing.assert_close(out[mask], tokens[mask], rtol=0, atol=0)
    pieces, start = [], 0
    for (h, w), (hb, wb) in zip(small_shapes, big_shapes):
        pieces.append(out[0, start : start + hb * wb].view(hb, wb, c)[:h, :w].reshape(1, h * w, c))
        start += hb * wb
    torch.testing.assert_close(torch.cat(pieces, 1), alone, rtol=0, atol=1e-6)
    # the other image is unpadded: the same as computing it on its own
    other = encoding.mix(0, tokens[1:], None, big_shapes)
    torch.testing.assert_close(out[1:], other, rtol=0, atol=1e-6)


def test_per_level_peg_gradients_flow_to_every_level():
    model = small_model("model.position.name=peg").train()
    encoding = model.transformer.position
    shapes = [(5, 6), (3, 3), (2, 2), (1, 1)]
    n = sum(h * w for h, w in shapes)
    tokens = torch.randn(2, n, 32, requires_grad=True)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[1, 20:30] = True
    encoding.mix(0, tokens, mask, shapes).square().sum().backward()
    for name, p in encoding.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    torch.testing.assert_close(tokens.grad[mask], 2 * tokens[mask].detach())


def test_peg_placement_changes_outputs_while_shared_weights_stay():
    sine = small_model("model.position.name=sine")
    sine_keys = set(sine.state_dict())
    images = images_of_different_sizes()
    results = {}
    for layers in ("[-1]", "[0]", "[0,1]"):
        model = small_model("model.position.name=peg", f"model.position.peg_layers={layers}", seed=1).eval()
        pegs = {k for k in model.state_dict() if k.startswith("transformer.position.")}
        assert set(model.state_dict()) - pegs == sine_keys
        missing, unexpected = model.load_state_dict(sine.state_dict(), strict=False)
        assert set(missing) == {k for k in pegs if not k.endswith("num_batches_tracked")} and not unexpected
        _randomize_norms(model.transformer.position)
        with torch.no_grad():
            results[layers] = model(images)["pred_logits"]
    assert not torch.allclose(results["[-1]"], results["[0]"])
    assert not torch.allclose(results["[0]"], results["[0,1]"])
    assert not torch.allclose(results["[-1]"], results["[0,1]"])
