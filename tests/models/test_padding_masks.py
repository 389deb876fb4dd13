"""Per-level padding masks follow the feature maps: an image on a larger canvas gets, at every level, the
valid extent it has alone, and valid ratios that scale it to the canvas.

Two mechanisms, each tested on canvases that are not multiples of the strides:

* the data side (the default): batches are padded to a multiple of ``model.size_divisibility``, where the
  official ``nearest`` rule is exact;
* the model side (``model.mask_rule=stride``): any canvas.

The official rule on such a canvas is shown to be wrong (the bug this guards against).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import detr_peg.models.deformable.transformer as deformable_transformer
from detr_peg.config import load_config
from detr_peg.data.padding import pad_images
from detr_peg.models import build_model
from detr_peg.models.masking import MASK_RULES, level_masks, select_strided
from tests.models.deformable.small_model import small_model

FOUR_LEVELS = ["model.transformer.num_feature_levels=4"]  # strides 8, 16, 32 and the extra 64
DETR = [
    "model.arch=detr",
    "model.num_classes=5",
    "model.num_queries=6",
    "model.backbone.name=resnet18",
    "model.transformer.hidden_dim=32",
    "model.transformer.nheads=2",
    "model.transformer.enc_layers=1",
    "model.transformer.dec_layers=1",
    "model.transformer.dim_feedforward=64",
]
# (image height, width, canvas height, width): canvases that are not multiples of 16, 32 or 64.
CASES = [
    (96, 96, 120, 120),
    (96, 80, 104, 100),
    (100, 70, 130, 90),
    (65, 90, 72, 150),
    (70, 47, 90, 110),
    (96, 96, 96, 97),
]


def _capture_layouts(monkeypatch) -> list:
    """Record every Deformable-DETR ``LevelLayout`` (masks and valid ratios) the transformer builds."""
    layouts = []
    original = deformable_transformer.flatten_levels

    def recording(srcs, masks):
        tokens, layout = original(srcs, masks)
        layouts.append(layout)
        return tokens, layout

    monkeypatch.setattr(deformable_transformer, "flatten_levels", recording)
    return layouts


def _valid_extent(mask: torch.Tensor) -> tuple[int, int]:
    """Valid rows and columns of one image's ``[H_l, W_l]`` mask (top-left aligned)."""
    return int((~mask[:, 0]).sum()), int((~mask[0, :]).sum())


def _deformable_levels(model, images: torch.Tensor, mask: torch.Tensor, layouts: list):
    layouts.clear()
    with torch.no_grad():
        model(images, mask)
    layout = layouts[-1]
    masks = layout.mask.split([h * w for h, w in layout.shapes], dim=1)
    return [m.view(-1, h, w) for m, (h, w) in zip(masks, layout.shapes)], layout.valid_ratios


def _check_against_alone(model, layouts, image: torch.Tensor, images: torch.Tensor, mask: torch.Tensor) -> None:
    alone_masks, alone_ratios = _deformable_levels(model, image[None], None, layouts)
    torch.testing.assert_close(alone_ratios, torch.ones_like(alone_ratios))
    masks, ratios = _deformable_levels(model, images, mask, layouts)
    for level, (alone, padded) in enumerate(zip(alone_masks, masks)):
        assert _valid_extent(padded[0]) == tuple(alone.shape[-2:]), level
        canvas = padded.shape[-2:]
        expected = torch.tensor([alone.shape[-1] / canvas[1], alone.shape[-2] / canvas[0]])  # (w, h) order
        torch.testing.assert_close(ratios[0, level], expected)


@pytest.mark.parametrize(("h", "w", "canvas_h", "canvas_w"), CASES)
def test_data_side_padding_gives_the_extent_of_the_image_alone(monkeypatch, h, w, canvas_h, canvas_w) -> None:
    model = small_model(*FOUR_LEVELS).eval()
    assert model.feature_strides == [8, 16, 32, 64] and model.size_divisibility == 64
    layouts = _capture_layouts(monkeypatch)
    g = torch.Generator().manual_seed(h * w)
    image, larger = torch.randn(3, h, w, generator=g), torch.randn(3, canvas_h, canvas_w, generator=g)
    images, mask = pad_images([image, larger], size_divisibility=model.size_divisibility)
    assert images.shape[-2] % 64 == 0 and images.shape[-1] % 64 == 0
    _check_against_alone(model, layouts, image, images, mask)
    # The model pads a list of images the same way.
    layouts.clear()
    with torch.no_grad():
        torch.testing.assert_close(model([image, larger]), model(images, mask))


@pytest.mark.parametrize(("h", "w", "canvas_h", "canvas_w"), CASES)
def test_stride_rule_gives_the_extent_of_the_image_alone_on_any_canvas(monkeypatch, h, w, canvas_h, canvas_w) -> None:
    model = small_model(*FOUR_LEVELS, "model.mask_rule=stride").eval()
    layouts = _capture_layouts(monkeypatch)
    image = torch.randn(3, h, w, generator=torch.Generator().manual_seed(h + w))
    images = F.pad(image, (0, canvas_w - w, 0, canvas_h - h))[None]
    mask = F.pad(torch.zeros(1, h, w, dtype=torch.bool), (0, canvas_w - w, 0, canvas_h - h), value=True)
    _check_against_alone(model, layouts, image, images, mask)


def test_official_rule_is_wrong_on_a_canvas_that_is_not_a_stride_multiple(monkeypatch) -> None:
    """The case of the report: 96 px on a 120 px canvas, 7 rows instead of 6 at stride 16, 4 instead of 3 at 32."""
    model = small_model(*FOUR_LEVELS).eval()
    layouts = _capture_layouts(monkeypatch)
    images = F.pad(torch.randn(1, 3, 96, 96), (0, 24, 0, 24))
    mask = F.pad(torch.zeros(1, 96, 96, dtype=torch.bool), (0, 24, 0, 24), value=True)
    masks, ratios = _deformable_levels(model, images, mask, layouts)
    assert [_valid_extent(m[0])[0] for m in masks] == [12, 7, 4, 2]  # alone: 12, 6, 3, 2
    torch.testing.assert_close(ratios[0, :, 1], torch.tensor([12 / 15, 7 / 8, 1.0, 1.0]))


@pytest.mark.parametrize("rule", MASK_RULES)
def test_detr_feature_mask_has_the_extent_of_the_image_alone(rule) -> None:
    torch.manual_seed(0)
    model = build_model(load_config(None, [*DETR, f"model.mask_rule={rule}"])).eval()
    assert model.size_divisibility == 32
    seen = []
    model.transformer.register_forward_hook(lambda module, inputs, output: seen.append(inputs[1]))
    for h, w, canvas_h, canvas_w in CASES:
        image = torch.randn(3, h, w)
        if rule == "stride":  # any canvas
            images = F.pad(image, (0, canvas_w - w, 0, canvas_h - h))[None]
            mask = F.pad(torch.zeros(1, h, w, dtype=torch.bool), (0, canvas_w - w, 0, canvas_h - h), value=True)
        else:  # the canvas the loaders make
            images, mask = pad_images([image, torch.zeros(3, canvas_h, canvas_w)], size_divisibility=32)
        with torch.no_grad():
            model(images, mask)
        assert _valid_extent(seen[-1][0]) == (-(-h // 32), -(-w // 32)), (h, w, canvas_h, canvas_w)


def test_the_rules_agree_on_stride_multiples_and_stride_follows_the_geometry() -> None:
    for stride in (8, 16, 32, 64):
        for h, w in [(96, 96), (1, 130), (65, 64), (200, 33)]:
            canvas = (-(-max(h, 130) // stride) * stride, -(-max(w, 130) // stride) * stride)
            mask = F.pad(torch.zeros(1, h, w, dtype=torch.bool), (0, canvas[1] - w, 0, canvas[0] - h), value=True)
            size = (canvas[0] // stride, canvas[1] // stride)
            nearest, strided = (level_masks(mask, [size], [stride], rule)[0] for rule in MASK_RULES)
            assert torch.equal(nearest, strided), (stride, h, w)
            # Any canvas: exactly ceil(h / s) x ceil(w / s) valid cells.
            odd = F.pad(mask, (0, 5, 0, 3), value=True)
            odd_size = (-(-odd.shape[1] // stride), -(-odd.shape[2] // stride))
            cells = select_strided(odd, odd_size, stride)[0]
            assert _valid_extent(cells) == (-(-h // stride), -(-w // stride))
            assert int((~cells).sum()) == (-(-h // stride)) * (-(-w // stride))
    with pytest.raises(ValueError, match="nearest, stride"):
        level_masks(torch.zeros(1, 8, 8, dtype=torch.bool), [(1, 1)], [8], "bilinear")
