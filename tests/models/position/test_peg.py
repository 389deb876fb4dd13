"""Properties of the PEG (CPVT's Positional Encoding Generator for detection)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from detr_peg.config import load_config
from detr_peg.errors import ConfigError
from detr_peg.models import build_model
from detr_peg.models.position import PEG, PEGEncoding, masked_batch_norm

C = 8


def _randomize_bn(peg: PEG, seed: int = 0) -> PEG:
    """Random BatchNorm statistics and affine parameters, so that the normalisation is not the identity."""
    g = torch.Generator().manual_seed(seed)
    dim = peg.norm.num_features
    with torch.no_grad():
        peg.norm.running_mean.copy_(torch.rand(dim, generator=g) - 0.5)
        peg.norm.running_var.copy_(torch.rand(dim, generator=g) + 0.5)
        peg.norm.weight.copy_(torch.rand(dim, generator=g) + 0.5)
        peg.norm.bias.copy_(torch.rand(dim, generator=g) - 0.5)
    return peg


def _peg(seed: int = 0) -> PEG:
    torch.manual_seed(seed)
    return _randomize_bn(PEG(C), seed)


def test_parameters_are_depthwise_conv_without_bias_plus_batchnorm_affine():
    for dim in (8, 64, 256):
        peg = PEG(dim)
        assert peg.proj.bias is None
        assert peg.proj.weight.shape == (dim, 1, 3, 3)
        assert sum(p.numel() for p in peg.parameters()) == dim * 9 + 2 * dim
    encoding = PEGEncoding(16, num_levels=3, layers=[0, 2])
    assert sum(p.numel() for p in encoding.parameters()) == 2 * 3 * (16 * 9 + 2 * 16)


def test_unpadded_output_is_the_cpvt_formula():
    peg = _peg().eval()
    x = torch.randn(2, C, 5, 7)
    expected = x + F.relu(
        F.batch_norm(
            F.conv2d(x, peg.proj.weight, padding=1, groups=C),
            peg.norm.running_mean,
            peg.norm.running_var,
            peg.norm.weight,
            peg.norm.bias,
            eps=peg.norm.eps,
        )
    )
    torch.testing.assert_close(peg(x), expected)
    torch.testing.assert_close(peg(x, torch.zeros(2, 5, 7, dtype=torch.bool)), expected)


def test_padded_tokens_come_out_unchanged():
    x = torch.randn(2, C, 6, 7)
    mask = torch.zeros(2, 6, 7, dtype=torch.bool)
    mask[0, 4:, :] = True
    mask[1, :, 5:] = True
    for training in (False, True):
        peg = _peg().train(training)
        out = peg(x, mask)
        torch.testing.assert_close(
            out[mask.unsqueeze(1).expand_as(x)], x[mask.unsqueeze(1).expand_as(x)], rtol=0, atol=0
        )
        assert not torch.allclose(out[:, :, :4, :5], x[:, :, :4, :5])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.float32])
def test_a_mask_that_is_not_bool_is_refused(dtype):
    """``~`` of a uint8 mask is 255/254, which would count every padded token as valid."""
    x, mask = torch.randn(2, 8, 6, 7), torch.zeros(2, 6, 7, dtype=dtype)
    with pytest.raises(ValueError, match=r"^mask must be a bool Tensor\[B, H, W\] matching \(2, 8, 6, 7\), got "):
        PEG(8).train()(x, mask)
    with pytest.raises(ValueError, match=r"^mask must be a bool Tensor\[B, H, W\] matching \(2, 8, 6, 7\), got bool"):
        PEG(8)(x, mask.bool()[:, :5])


def test_eval_output_is_identical_alone_and_padded_next_to_a_larger_image():
    peg = _peg().eval()
    small = torch.randn(C, 3, 4)
    large = torch.randn(C, 6, 7)
    alone = peg(small[None])
    batch = torch.zeros(2, C, 6, 7)
    batch[0, :, :3, :4] = small
    batch[0, :, 3:, :] = 100.0  # garbage in the padding must not leak in
    batch[0, :, :, 4:] = -50.0
    batch[1] = large
    mask = torch.ones(2, 6, 7, dtype=torch.bool)
    mask[0, :3, :4] = False
    mask[1] = False
    padded = peg(batch, mask)
    torch.testing.assert_close(padded[0, :, :3, :4], alone[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(padded[1], peg(large[None])[0], rtol=0, atol=1e-6)


def test_sequence_form_is_padding_invariant_over_levels():
    torch.manual_seed(0)
    encoding = PEGEncoding(C, num_levels=2, layers=[0]).eval()
    for level in encoding.pegs["layer0"].values():
        _randomize_bn(level)
    shapes_small, shapes_big = [(3, 4), (2, 2)], [(5, 6), (3, 3)]
    levels_small = [torch.randn(1, h * w, C) for h, w in shapes_small]
    alone = encoding.mix(0, torch.cat(levels_small, 1), None, shapes_small)

    tokens, masks = [], []
    for (h, w), (hb, wb), lv in zip(shapes_small, shapes_big, levels_small):
        grid = torch.full((2, hb, wb, C), 7.0)
        grid[0, :h, :w] = lv[0].view(h, w, C)
        grid[1] = torch.randn(hb, wb, C)
        m = torch.ones(2, hb, wb, dtype=torch.bool)
        m[0, :h, :w] = False
        m[1] = False
        tokens.append(grid.flatten(1, 2))
        masks.append(m.flatten(1))
    out = encoding.mix(0, torch.cat(tokens, 1), torch.cat(masks, 1), shapes_big)
    pieces, start = [], 0
    for (h, w), (hb, wb) in zip(shapes_small, shapes_big):
        grid = out[0, start : start + hb * wb].view(hb, wb, C)
        pieces.append(grid[:h, :w].reshape(h * w, C))
        start += hb * wb
    torch.testing.assert_close(torch.cat(pieces)[None], alone, rtol=0, atol=1e-6)
    # padded tokens unchanged in the sequence form too
    full_mask = torch.cat(masks, 1)
    torch.testing.assert_close(out[full_mask], torch.cat(tokens, 1)[full_mask], rtol=0, atol=0)


def test_works_down_to_a_one_by_one_feature_map():
    peg = _peg().eval()
    x = torch.randn(3, C, 1, 1)
    centre = peg.proj.weight[:, 0, 1, 1].view(1, C, 1, 1)
    bn = peg.norm
    expected = x + F.relu(
        (centre * x - bn.running_mean.view(1, C, 1, 1))
        / torch.sqrt(bn.running_var.view(1, C, 1, 1) + bn.eps)
        * bn.weight.view(1, C, 1, 1)
        + bn.bias.view(1, C, 1, 1)
    )
    torch.testing.assert_close(peg(x), expected)
    mask = torch.tensor([False, True, False]).view(3, 1, 1)
    out = peg.train()(x, mask)
    torch.testing.assert_close(out[1], x[1], rtol=0, atol=0)


def test_gradients_flow_to_weights_and_tokens():
    peg = _peg().train()
    x = torch.randn(2, C, 4, 5, requires_grad=True)
    mask = torch.zeros(2, 4, 5, dtype=torch.bool)
    mask[1, 3:, :] = True
    peg(x, mask).square().sum().backward()
    for name, p in peg.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad[0].abs().min() > 0
    # a padded token only passes through unchanged: its gradient is exactly d(out^2)/d(out) = 2x
    torch.testing.assert_close(x.grad[1, :, 3:, :], 2 * x[1, :, 3:, :].detach())


def test_masked_batch_norm_matches_batchnorm2d_without_padding():
    torch.manual_seed(0)
    x = torch.randn(3, C, 4, 5)
    ours, ref = nn.BatchNorm2d(C), nn.BatchNorm2d(C)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.uniform_(-0.5, 0.5)
    ref.load_state_dict(ours.state_dict())
    for _ in range(3):
        out = masked_batch_norm(x, torch.ones(3, 1, 4, 5, dtype=torch.bool), ours)
        torch.testing.assert_close(out, ref(x))
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value)


def test_masked_batch_norm_statistics_come_from_valid_positions_only():
    torch.manual_seed(0)
    x = torch.randn(2, C, 4, 5)
    valid = torch.ones(2, 1, 4, 5, dtype=torch.bool)
    valid[0, :, 2:, :] = False
    bn = nn.BatchNorm2d(C, momentum=None)
    out = masked_batch_norm(x, valid, bn)
    rows = x.permute(0, 2, 3, 1)[valid[:, 0]]  # [N_valid, C]
    mean, var = rows.mean(0), rows.var(0, unbiased=False)
    expected = (x - mean.view(1, C, 1, 1)) / torch.sqrt(var.view(1, C, 1, 1) + bn.eps)
    torch.testing.assert_close(out[valid.expand_as(x)], expected[valid.expand_as(x)])
    torch.testing.assert_close(bn.running_mean, mean)  # cumulative average of one batch = its mean
    torch.testing.assert_close(bn.running_var, rows.var(0, unbiased=True))
    # garbage in the padding changes nothing
    x2 = x.clone()
    x2[0, :, 2:, :] = 1e3
    bn2 = nn.BatchNorm2d(C, momentum=None)
    out2 = masked_batch_norm(x2, valid, bn2)
    torch.testing.assert_close(out2[valid.expand_as(x)], out[valid.expand_as(x)])
    torch.testing.assert_close(bn2.running_var, bn.running_var)


def _small_detr(position: str, *overrides: str):
    cfg = load_config(
        None,
        [
            "model.num_classes=3",
            "model.backbone.name=resnet18",
            "model.num_queries=5",
            "model.transformer.hidden_dim=32",
            "model.transformer.nheads=4",
            "model.transformer.enc_layers=2",
            "model.transformer.dec_layers=1",
            "model.transformer.dim_feedforward=64",
            f"model.position.name={position}",
            *overrides,
        ],
    )
    torch.manual_seed(0)
    return build_model(cfg)


def test_peg_detr_adds_no_positional_embedding_and_mixes_after_configured_layers():
    model = _small_detr("peg", "model.position.peg_layers=[0,1]").eval()
    assert model.transformer.position(torch.zeros(1, 2, 2, dtype=torch.bool)) is None
    assert [model.transformer.position.mixes_after(i) for i in (-1, 0, 1)] == [False, True, True]
    calls = []
    model.transformer.position.register_forward_hook(lambda *a: calls.append("embed"))
    original = model.transformer.position.mix
    model.transformer.position.mix = lambda layer, *a: calls.append(layer) or original(layer, *a)
    images = [torch.randn(3, 64, 80), torch.randn(3, 96, 64)]
    with torch.no_grad():
        out = model(images)
    assert calls == ["embed", 0, 1]
    assert out["pred_boxes"].shape == (2, 5, 4)


@pytest.mark.parametrize("layers", [[-1], [0], [1], [-1, 1]])
def test_peg_acts_exactly_after_the_configured_encoder_layers(layers):
    """The encoder's memory equals the layers run by hand with the CPVT formula inserted where configured."""
    model = _small_detr("peg", f"model.position.peg_layers={layers}").eval()
    pegs = model.transformer.position.pegs
    assert sorted(int(name.removeprefix("layer")) for name in pegs) == layers
    for seed, name in enumerate(pegs):
        _randomize_bn(pegs[name]["level0"], seed)
    seen = {}
    model.transformer.register_forward_pre_hook(lambda module, args: seen.update(src=args[0], mask=args[1]))
    model.transformer.register_forward_hook(lambda module, args, out: seen.update(memory=out[1]))
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 80))
        src, mask = seen["src"], seen["mask"]
        assert not mask.any()
        b, c, h, w = src.shape

        def cpvt(x: torch.Tensor, peg: PEG) -> torch.Tensor:  # x + ReLU(BN(depthwise conv(x))), tokens [B, HW, C]
            grid = x.transpose(1, 2).reshape(b, c, h, w)
            y = F.batch_norm(
                F.conv2d(grid, peg.proj.weight, padding=1, groups=c),
                peg.norm.running_mean,
                peg.norm.running_var,
                peg.norm.weight,
                peg.norm.bias,
                eps=peg.norm.eps,
            )
            return (grid + F.relu(y)).flatten(2).transpose(1, 2)

        tokens = src.flatten(2).transpose(1, 2)
        if -1 in layers:
            tokens = cpvt(tokens, pegs["layer-1"]["level0"])
        for i, layer in enumerate(model.transformer.encoder.layers):
            tokens = layer(tokens, mask.flatten(1), None)
            if i in layers:
                tokens = cpvt(tokens, pegs[f"layer{i}"]["level0"])
    assert model.transformer.encoder.norm is None  # post-norm DETR
    torch.testing.assert_close(seen["memory"], tokens.transpose(1, 2).reshape(b, c, h, w))


@pytest.mark.parametrize(
    "layers, message",
    [
        ("[0,0]", r"peg_layers \[0, 0\] lists layer 0 more than once"),
        ("[-1,1,-1]", r"peg_layers \[-1, 1, -1\] lists layer -1 more than once"),
        ("[0,2]", r"peg_layers \[0, 2\] has \[2\] outside -1..1 \(the encoder has 2 layers"),
    ],
)
def test_peg_layers_name_each_encoder_layer_once(layers: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _small_detr("peg", f"model.position.peg_layers={layers}")


def test_float16_statistics_hold_beyond_the_largest_float16_count() -> None:
    """90,000 valid positions: a float16 count would be inf; the result is the float32 one, rounded to float16."""
    torch.manual_seed(0)
    x = torch.randn(1, C, 300, 302)
    mask = torch.zeros(1, 300, 302, dtype=torch.bool)
    mask[:, :, 301:] = True  # 90,300 valid positions
    reference, half = _peg().train(), _peg().train()
    half.load_state_dict(reference.state_dict())
    expected = reference(x, mask)
    got = half.half()(x.half(), mask)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(half.norm.running_var.float(), reference.norm.running_var, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(half.norm.running_mean.float(), reference.norm.running_mean, atol=1e-3, rtol=1e-3)
