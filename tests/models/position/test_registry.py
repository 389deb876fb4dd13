"""Every registered positional encoding passes the same tests (a new one gets them for free)."""

from __future__ import annotations

import pytest
import torch

from detr_peg.config import PositionConfig, load_config
from detr_peg.errors import ConfigError
from detr_peg.models import build_criterion, build_model
from detr_peg.models.position import POSITION_ENCODINGS, PositionalEncoding, build_position_encoding

NAMES = POSITION_ENCODINGS.names()
DIM = 16


def test_the_four_paper_encodings_are_registered():
    assert {"sine", "learned", "none", "peg"} <= set(NAMES)


def test_unknown_name_lists_the_valid_names():
    with pytest.raises(ConfigError) as info:
        build_position_encoding(PositionConfig(name="rope"), dim=DIM, num_levels=1, num_layers=2)
    message = str(info.value)
    assert "'rope'" in message
    for name in NAMES:
        assert repr(name) in message


def _build(name: str, num_levels: int = 2) -> PositionalEncoding:
    torch.manual_seed(0)
    return build_position_encoding(PositionConfig(name=name), dim=DIM, num_levels=num_levels, num_layers=2,
                                   default_offset=0.0).eval()


@pytest.mark.parametrize("name", NAMES)
def test_embedding_shape_and_padding_independence(name):
    encoding = _build(name)
    mask = torch.ones(2, 6, 7, dtype=torch.bool)
    mask[0, :3, :4] = False
    mask[1] = False
    pos = encoding(mask)
    alone = encoding(torch.zeros(1, 3, 4, dtype=torch.bool))
    if pos is None:
        assert alone is None
        return
    assert pos.shape == (2, DIM, 6, 7) and pos.dtype == torch.float32
    assert torch.isfinite(pos).all()
    torch.testing.assert_close(pos[0, :, :3, :4], alone[0])


@pytest.mark.parametrize("name", NAMES)
def test_mix_keeps_shape_and_padded_tokens(name):
    encoding = _build(name).train()
    shapes = [(4, 5), (2, 3)]
    n = sum(h * w for h, w in shapes)
    tokens = torch.randn(2, n, DIM)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[0, 12:20] = True
    mask[0, 23:26] = True
    for layer in (-1, 0, 1):
        out = encoding.mix(layer, tokens, mask, shapes)
        assert out.shape == tokens.shape
        torch.testing.assert_close(out[mask], tokens[mask], rtol=0, atol=0)
        if not encoding.mixes_after(layer):
            assert out is tokens


@pytest.mark.parametrize("name", NAMES)
def test_detr_with_each_encoding_trains(name):
    cfg = load_config(None, ["model.num_classes=3", "model.backbone.name=resnet18", "model.num_queries=4",
                             "model.transformer.hidden_dim=16", "model.transformer.nheads=2",
                             "model.transformer.enc_layers=2", "model.transformer.dec_layers=2",
                             "model.transformer.dim_feedforward=32", f"model.position.name={name}"])
    torch.manual_seed(0)
    model = build_model(cfg).train()
    criterion = build_criterion(cfg)
    images = [torch.randn(3, 70, 90), torch.randn(3, 100, 64)]
    targets = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.5, 0.5, 0.3, 0.4], [0.2, 0.3, 0.1, 0.2]])},
               {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.6, 0.4, 0.5, 0.5]])}]
    out = model(images)
    assert out["pred_logits"].shape == (2, 4, 4) and len(out["aux_outputs"]) == 1
    loss = criterion.weighted_total(criterion(out, targets))
    assert torch.isfinite(loss)
    loss.backward()
    for pname, p in model.named_parameters():
        if p.requires_grad and not pname.startswith("backbone."):
            assert p.grad is not None and torch.isfinite(p.grad).all(), pname
    position_params = list(model.transformer.position.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in position_params)
