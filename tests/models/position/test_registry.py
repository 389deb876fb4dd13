"""Every registered positional encoding passes the same tests (a new one gets them for free).

The tests are parametrized over :data:`POSITION_ENCODINGS` when they are
collected, so an encoding registered before collection (a new module in
``detr_peg/models/position``, or a plug-in folder added to the package path,
see ``test_discovery.py``) is tested with the built-in ones.
"""

from __future__ import annotations

import pytest
import torch

from detr_peg.config import PositionConfig, load_config
from detr_peg.config.options import ENCODING_OPTIONS
from detr_peg.errors import ConfigError
from detr_peg.models import build_criterion, build_model
from detr_peg.models.position import POSITION_ENCODINGS, PositionalEncoding, build_position_encoding

NAMES = POSITION_ENCODINGS.names()
DIM = 16
# Padded grids of two levels and the valid area of image 0 on each (image 1 fills its grids).
PADDED = [(6, 7), (3, 4)]
VALID = [(3, 4), (2, 2)]


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
    options = ENCODING_OPTIONS.get(name)(name=name)
    return build_position_encoding(options, dim=DIM, num_levels=num_levels, num_layers=2).eval()


def _masks() -> list[torch.Tensor]:
    masks = []
    for (h, w), (vh, vw) in zip(PADDED, VALID):
        mask = torch.ones(2, h, w, dtype=torch.bool)
        mask[0, :vh, :vw] = False
        mask[1] = False
        masks.append(mask)
    return masks


@pytest.mark.parametrize("name", NAMES)
def test_an_image_is_encoded_alike_alone_and_padded_in_a_batch(name):
    """Padding invariance of both kinds of encoding: the ``pos`` map and the token mixing.

    Image 0 sits in the top-left corner of a larger padded grid next to a
    full image; what the encoding adds to it (``pos``) and what it makes of
    its tokens (``mix`` after every layer, in eval mode) must equal what it
    does to the image alone, on every valid position. Padded tokens come
    out unchanged.
    """
    encoding = _build(name)
    torch.manual_seed(1)
    masks = _masks()
    for mask, (vh, vw) in zip(masks, VALID):
        pos = encoding(mask)
        alone = encoding(torch.zeros(1, vh, vw, dtype=torch.bool))
        assert (pos is None) == (alone is None)
        if pos is not None:
            assert pos.shape == (2, DIM, *mask.shape[1:]) and pos.dtype == torch.float32
            assert torch.isfinite(pos).all()
            torch.testing.assert_close(pos[0, :, :vh, :vw], alone[0])

    grids = [torch.randn(2, DIM, h, w) for h, w in PADDED]
    tokens = torch.cat([g.flatten(2).transpose(1, 2) for g in grids], dim=1)
    flat_mask = torch.cat([m.flatten(1) for m in masks], dim=1)
    alone_tokens = torch.cat([g[:1, :, :vh, :vw].flatten(2).transpose(1, 2) for g, (vh, vw) in zip(grids, VALID)], 1)
    alone_mask = torch.zeros(1, alone_tokens.shape[1], dtype=torch.bool)
    for layer in (-1, 0, 1):
        out = encoding.mix(layer, tokens, flat_mask, PADDED)
        out_alone = encoding.mix(layer, alone_tokens, alone_mask, VALID)
        assert out.shape == tokens.shape
        torch.testing.assert_close(out[flat_mask], tokens[flat_mask], rtol=0, atol=0)
        start, valid_out = 0, []
        for (h, w), (vh, vw) in zip(PADDED, VALID):
            grid = out[0, start : start + h * w].reshape(h, w, DIM)
            valid_out.append(grid[:vh, :vw].reshape(vh * vw, DIM))
            start += h * w
        torch.testing.assert_close(torch.cat(valid_out), out_alone[0])


@pytest.mark.parametrize("name", NAMES)
def test_mix_keeps_shape_and_padded_tokens_in_training(name):
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
def test_detr_with_each_encoding_learns(name):
    """Chosen by name in a config, the encoding gets its own options and a DETR that learns a batch.

    Each of a few AdamW steps on one batch lowers the loss, and every parameter of the
    encoding (where it has any) receives a gradient and changes.
    """
    cfg = load_config(
        None,
        [
            "model.num_classes=3",
            "model.backbone.name=resnet18",
            "model.num_queries=4",
            "model.transformer.hidden_dim=16",
            "model.transformer.nheads=2",
            "model.transformer.enc_layers=2",
            "model.transformer.dec_layers=2",
            "model.transformer.dim_feedforward=32",
            "model.transformer.dropout=0",
            "model.backbone.train=false",
            f"model.position.name={name}",
        ],
    )
    assert type(cfg.model.position) is ENCODING_OPTIONS.get(name)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    criterion = build_criterion(cfg)
    images = [torch.randn(3, 70, 90), torch.randn(3, 100, 64)]
    targets = [
        {"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.5, 0.5, 0.3, 0.4], [0.2, 0.3, 0.1, 0.2]])},
        {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.6, 0.4, 0.5, 0.5]])},
    ]
    position = model.transformer.position
    before = {pname: p.detach().clone() for pname, p in position.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    losses = []
    for _ in range(4):
        out = model(images)
        assert out["pred_logits"].shape == (2, 4, 4) and len(out["aux_outputs"]) == 1
        loss = criterion.weighted_total(criterion(out, targets))
        assert torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        for pname, p in position.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, pname
        optimizer.step()
        losses.append(loss.item())
    # Learning, not a monotone path: four Adam steps may wobble once (the toy encoding's second step does).
    assert losses[-1] == min(losses) and losses[-1] < 0.98 * losses[0], losses
    for pname, p in position.named_parameters():
        assert not torch.equal(p, before[pname]), f"{name}: {pname} did not change"
