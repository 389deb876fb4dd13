"""The CPU dropout: its mask, scale, gradient and statistics, and where the models use it."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from detr_peg.config import load_config
from detr_peg.models import build_model
from detr_peg.models.dropout import LEVELS, Dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_training_output_and_gradient_are_the_masked_scaled_input(p: float) -> None:
    x = torch.randn(3, 37, 11, requires_grad=True)
    drop = Dropout(p).train()
    torch.manual_seed(7)
    y = drop(x)
    grad = torch.randn_like(y)
    y.backward(grad)
    torch.manual_seed(7)
    keep, scale = keep_mask(x.shape, p)
    rounded = round(p * LEVELS) / LEVELS
    assert scale == pytest.approx(1 / (1 - rounded))
    assert keep.dtype == torch.bool and keep.shape == x.shape
    torch.testing.assert_close(y, x.detach() * keep * scale, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, grad * keep * scale, rtol=0, atol=0)
    assert 0 < int(keep.sum()) < keep.numel()


def test_bfloat16_input_keeps_its_dtype() -> None:
    x = torch.randn(64, 16).to(torch.bfloat16)
    torch.manual_seed(1)
    y = Dropout(0.1).train()(x)
    torch.manual_seed(1)
    keep, scale = keep_mask(x.shape, 0.1)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, x.mul(keep).mul_(scale), rtol=0, atol=0)


@pytest.mark.parametrize("p", [0.1, 0.37])
def test_every_lane_of_a_random_word_drops_at_the_rate(p: float) -> None:
    """Each of the four 16-bit parts of a 64-bit draw is uniform: no lane keeps more than the others."""
    n = 1 << 22
    torch.manual_seed(0)
    keep, scale = keep_mask(torch.Size([n]), p)
    dropped = (~keep).reshape(-1, 4).double().mean(0)
    rounded = round(p * LEVELS) / LEVELS
    sigma = math.sqrt(rounded * (1 - rounded) / (n // 4))
    torch.testing.assert_close(dropped, torch.full((4,), rounded, dtype=torch.float64), rtol=0, atol=5 * sigma)
    # The expectation of a kept-and-scaled one is one.
    assert float(keep.double().mean()) * scale == pytest.approx(1.0, abs=5 * sigma * scale)


def test_evaluation_zero_rate_and_inplace_are_torch_dropout() -> None:
    x = torch.randn(5, 9)
    torch.testing.assert_close(Dropout(0.5).eval()(x), x, rtol=0, atol=0)
    torch.testing.assert_close(Dropout(0.0).train()(x), x, rtol=0, atol=0)
    torch.manual_seed(3)
    expected = nn.functional.dropout(x.clone(), 0.5, True, True)
    torch.manual_seed(3)
    torch.testing.assert_close(Dropout(0.5, inplace=True).train()(x.clone()), expected, rtol=0, atol=0)


def test_same_seed_same_mask_other_seed_other_mask() -> None:
    x = torch.ones(4096)
    drop = Dropout(0.2).train()
    torch.manual_seed(11)
    a = drop(x)
    torch.manual_seed(11)
    b = drop(x)
    torch.manual_seed(12)
    c = drop(x)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)


def test_rates_that_do_not_round_into_range_are_refused() -> None:
    with pytest.raises(ValueError, match="must be in \\[0, 1\\)"):
        keep_mask(torch.Size([4]), 1.0)


@pytest.mark.parametrize("config", ["configs/detr_r50_sine.yaml", "configs/deformable_detr_r50_peg.yaml"])
def test_the_transformers_use_it(config: str) -> None:
    cfg = load_config(config, ["model.backbone.weights=null", "model.num_classes=3"])
    model = build_model(cfg)
    drops = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert drops and all(isinstance(m, Dropout) for m in drops)
    assert all(m.p == cfg.model.transformer.dropout for m in drops)
