"""The v2 augmentation pipeline on images with known boxes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from detr_peg.config.schema import DataConfig
from detr_peg.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    BoxesToNormalizedCxcywh,
    RandomSizeCrop,
    build_eval_transforms,
    build_train_transforms,
    resize_sample,
    resized_size,
    sanitize_boxes,
    short_side_resize,
)
from detr_peg.errors import ConfigError


def coordinate_image(h: int, w: int) -> tv_tensors.Image:
    """Channel 0 holds the column index, channel 1 the row index (both < 256)."""
    assert h <= 256 and w <= 256
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return tv_tensors.Image(torch.stack([xs, ys, (xs + ys) % 256]).to(torch.uint8))


def sample(h: int, w: int, boxes: list[list[float]]) -> tuple[tv_tensors.Image, dict]:
    target = {
        "boxes": tv_tensors.BoundingBoxes(
            torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), format="XYXY", canvas_size=(h, w)
        ),
        "labels": torch.arange(len(boxes), dtype=torch.int64),
        "image_id": 5,
        "orig_size": torch.tensor([h, w]),
    }
    return coordinate_image(h, w), target


def normalized_cxcywh(xyxy: list[list[float]], h: float, w: float) -> torch.Tensor:
    b = torch.tensor(xyxy, dtype=torch.float64).reshape(-1, 4)
    x0, y0, x1, y1 = b.unbind(1)
    return torch.stack([(x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h], 1).float()


def imagenet_normalize(image_uint8: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (image_uint8.float() / 255 - mean) / std


BOXES = [[10.0, 5.0, 30.0, 25.0], [0.0, 0.0, 80.0, 60.0], [70.5, 40.25, 79.0, 59.5]]


def no_aug(**changes) -> DataConfig:
    """Training config whose only random step is what ``changes`` turns on (image 60x80 keeps its size)."""
    base = dict(hflip_prob=0.0, crop_prob=0.0, train_scales=[60], train_max_size=1000)
    base.update(changes)
    return DataConfig(**base)


def test_identity_pipeline_normalizes_image_and_boxes() -> None:
    image, target = sample(60, 80, BOXES)
    out_image, out = build_train_transforms(no_aug())(image, target)
    assert type(out_image) is torch.Tensor and type(out["boxes"]) is torch.Tensor
    assert out_image.dtype == torch.float32 and out_image.shape == (3, 60, 80)
    torch.testing.assert_close(out_image, imagenet_normalize(image))
    torch.testing.assert_close(out["boxes"], normalized_cxcywh(BOXES, 60, 80))
    torch.testing.assert_close(out["labels"], torch.tensor([0, 1, 2]))
    assert out["image_id"] == 5
    torch.testing.assert_close(out["orig_size"], torch.tensor([60, 80]))


def test_horizontal_flip_maps_boxes_exactly() -> None:
    image, target = sample(60, 80, BOXES)
    out_image, out = build_train_transforms(no_aug(hflip_prob=1.0))(image, target)
    flipped = [[80 - x1, y0, 80 - x0, y1] for x0, y0, x1, y1 in BOXES]
    torch.testing.assert_close(out["boxes"], normalized_cxcywh(flipped, 60, 80))
    torch.testing.assert_close(out_image, imagenet_normalize(image.flip(-1)))


def test_flip_probability_is_used() -> None:
    transform = build_train_transforms(no_aug(hflip_prob=0.5))
    torch.manual_seed(0)
    flips = 0
    for _ in range(200):
        _, out = transform(*sample(60, 80, [[0.0, 0.0, 20.0, 60.0]]))
        flips += bool(out["boxes"][0, 0] > 0.5)
    assert 70 < flips < 130


@pytest.mark.parametrize(
    "hw, scale, max_size, expected",
    [
        ((60, 80), 120, 1000, (120, 160)),  # short side reaches the scale
        ((80, 60), 30, 1000, (40, 30)),  # portrait, downscale
        ((20, 200), 50, 300, (30, 300)),  # long side capped at max_size exactly
        ((60, 80), 128, 128, (96, 128)),  # tiny config: scale == max_size
        ((50, 50), 128, 128, (128, 128)),
        ((60, 80), 200, 128, (96, 128)),  # scale above max_size
    ],
)
def test_eval_resize(hw, scale, max_size, expected) -> None:
    h, w = hw
    boxes = [[1.0, 2.0, w - 3.0, h - 4.0], [w / 2, h / 2, w / 2 + 1, h / 2 + 1]]
    cfg = DataConfig(val_scale=scale, val_max_size=max_size)
    out_image, out = build_eval_transforms(cfg)(*sample(h, w, boxes))
    assert tuple(out_image.shape) == (3, *expected)
    # Normalized boxes do not change under resizing, and no box is dropped.
    torch.testing.assert_close(out["boxes"], normalized_cxcywh(boxes, h, w))


SIDES = [1, 2, 3, 7, 48, 103, 150, 640, 2000]


@pytest.mark.parametrize(
    "short, max_size",
    [(s, m) for s in (2, 3, 64, 96, 800) for m in (None, 2, 96, 1333)],
)
def test_resized_size_is_torchvisions_rule_with_sides_of_at_least_one_pixel(short, max_size) -> None:
    # torchvision's sizes, read off boxes (no pixels to allocate); where they hold a 0 its image kernel refuses.
    reference = v2.Resize(None if max_size and short >= max_size else short, max_size=max_size)
    floored = 0
    for h in SIDES:
        for w in SIDES:
            boxes = tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=(h, w))
            expected = tuple(reference(boxes).canvas_size)
            floored += min(expected) == 0
            assert resized_size(h, w, short, max_size) == tuple(max(1, side) for side in expected), (h, w)
    if max_size is not None and max_size >= 96:
        assert floored > 0  # the grid holds images that torchvision sizes 0 px


@pytest.mark.parametrize("shape", [(1, 150), (150, 1), (2, 250)])
def test_an_image_far_longer_than_wide_keeps_one_pixel_and_its_boxes(shape) -> None:
    h, w = shape
    boxes = [[0.0, 0.0, float(w), float(h)]]
    cfg = DataConfig(val_scale=64, val_max_size=96)
    image, target = build_eval_transforms(cfg)(*sample(h, w, boxes))
    expected = (1, 96) if h < w else (96, 1)
    assert tuple(image.shape) == (3, *expected)
    # Normalised boxes are the same at any size; this shows the box is kept, not dropped as degenerate.
    torch.testing.assert_close(target["boxes"], normalized_cxcywh(boxes, h, w))
    train_image, train_target = build_train_transforms(no_aug(train_scales=[64], train_max_size=96))(
        *sample(h, w, boxes)
    )
    torch.testing.assert_close(train_image, image)
    torch.testing.assert_close(train_target["boxes"], target["boxes"])
    batch_image, batch_target = resize_sample(image, target, 32, 48)
    assert tuple(batch_image.shape[-2:]) == ((1, 48) if h < w else (48, 1))
    assert batch_target["size"].tolist() == list(batch_image.shape[-2:])


def test_random_short_side_resize_respects_scales_and_max() -> None:
    scales, max_size = [32, 40, 48, 56], 70
    transform = short_side_resize(scales, max_size)
    torch.manual_seed(0)
    seen = set()
    for _ in range(100):
        out = transform(coordinate_image(60, 80))
        h, w = out.shape[-2:]
        assert max(h, w) <= max_size
        assert min(h, w) in scales or max(h, w) == max_size
        seen.add((h, w))
    assert seen == {(32, 42), (40, 53), (48, 64), (52, 70)}


def crop_then_sanitize(min_size: int, max_size: int) -> v2.Compose:
    return v2.Compose([RandomSizeCrop(min_size, max_size), sanitize_boxes()])


def test_random_size_crop_boxes_follow_the_crop() -> None:
    boxes = [[10.0, 10.0, 30.0, 30.0], [40.0, 5.0, 100.0, 50.0], [0.0, 0.0, 100.0, 60.0], [90.0, 50.0, 99.0, 59.0]]
    transform = crop_then_sanitize(20, 50)
    torch.manual_seed(0)
    sizes = set()
    for _ in range(300):
        image, target = sample(60, 100, boxes)
        out_image, out = transform(image, target)
        left, top = int(out_image[0, 0, 0]), int(out_image[1, 0, 0])
        ch, cw = out_image.shape[-2:]
        assert 20 <= ch <= 50 and 20 <= cw <= 50
        sizes.add((ch, cw))
        torch.testing.assert_close(out_image, image[:, top : top + ch, left : left + cw])
        assert out["boxes"].canvas_size == (ch, cw)
        b = torch.tensor(boxes) - torch.tensor([left, top, left, top])
        b[:, 0::2] = b[:, 0::2].clamp(0, cw)
        b[:, 1::2] = b[:, 1::2].clamp(0, ch)
        wh = b[:, 2:] - b[:, :2]
        keep = (wh >= 1).all(1) & (wh.prod(1) >= 1)
        torch.testing.assert_close(out["boxes"].as_subclass(torch.Tensor), b[keep])
        torch.testing.assert_close(out["labels"], torch.arange(4)[keep])
        assert keep[2]  # the full-image box always survives
    assert len(sizes) > 100  # heights and widths drawn independently


def test_random_size_crop_drops_boxes_outside_and_slivers() -> None:
    class FixedCrop(RandomSizeCrop):
        def make_params(self, flat_inputs):
            return dict(top=10, left=20, height=30, width=40)

    boxes = [[0.0, 0.0, 10.0, 10.0], [25.0, 15.0, 35.0, 25.0], [50.0, 30.0, 90.0, 55.0], [59.5, 20.0, 70.0, 30.0]]
    image, target = sample(60, 100, boxes)
    out_image, out = v2.Compose([FixedCrop(1, 100), sanitize_boxes()])(image, target)
    assert out_image.shape[-2:] == (30, 40)
    expected = torch.tensor([[5.0, 5.0, 15.0, 15.0], [30.0, 20.0, 40.0, 30.0]])
    torch.testing.assert_close(out["boxes"].as_subclass(torch.Tensor), expected)
    torch.testing.assert_close(out["labels"], torch.tensor([1, 2]))


def test_random_size_crop_keeps_a_side_shorter_than_min_size() -> None:
    torch.manual_seed(0)
    for _ in range(20):
        out = RandomSizeCrop(50, 80)(coordinate_image(30, 100))
        assert out.shape[-2] == 30 and 50 <= out.shape[-1] <= 80


def test_boxes_to_normalized_cxcywh_exact() -> None:
    boxes = tv_tensors.BoundingBoxes(
        [[10.0, 20.0, 30.0, 60.0], [0.0, 0.0, 200.0, 100.0]], format="XYXY", canvas_size=(100, 200)
    )
    out = BoxesToNormalizedCxcywh()(boxes)
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, torch.tensor([[0.1, 0.4, 0.1, 0.4], [0.5, 0.5, 1.0, 1.0]]), rtol=0, atol=1e-7)
    xywh = tv_tensors.BoundingBoxes([[10.0, 20.0, 20.0, 40.0]], format="XYWH", canvas_size=(100, 200))
    torch.testing.assert_close(BoxesToNormalizedCxcywh()(xywh), out[:1])


@pytest.mark.parametrize(
    "cfg",
    [
        DataConfig(),
        DataConfig(train_scales=[128], train_max_size=128, crop_scales=[96, 112, 128], crop_size=[64, 128]),
        DataConfig(crop_prob=1.0, crop_scales=[100], crop_size=[384, 600], train_scales=[64, 96], train_max_size=120),
    ],
    ids=["detr-default", "tiny", "always-crop-small"],
)
def test_train_pipeline_outputs_valid_targets(cfg: DataConfig) -> None:
    transform = build_train_transforms(cfg)
    torch.manual_seed(0)
    for _ in range(40):
        h, w = int(torch.randint(40, 200, ())), int(torch.randint(40, 200, ()))
        boxes = [[w * 0.1, h * 0.2, w * 0.3, h * 0.9], [w * 0.5, 0.0, float(w), h * 0.1], [0.0, 0.0, 2.0, 2.0]]
        out_image, out = transform(*sample(h, w, boxes))
        oh, ow = out_image.shape[-2:]
        assert max(oh, ow) <= cfg.train_max_size
        assert min(oh, ow) in cfg.train_scales or max(oh, ow) == cfg.train_max_size
        b = out["boxes"]
        assert b.dtype == torch.float32 and b.shape == (len(out["labels"]), 4)
        assert torch.isfinite(b).all() and (b[:, 2:] > 0).all()
        assert (b[:, :2] - b[:, 2:] / 2 >= -1e-6).all() and (b[:, :2] + b[:, 2:] / 2 <= 1 + 1e-6).all()


def test_bad_config_values_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"data.crop_size is \[600, 384\]"):
        build_train_transforms(DataConfig(crop_size=[600, 384]))
    with pytest.raises(ConfigError, match=r"data.crop_size is \[1\]; it must be \[min, max\]"):
        build_train_transforms(DataConfig(crop_size=[1], crop_prob=0.0))  # refused even where no crop is drawn
    with pytest.raises(ConfigError, match="data.train_scales"):
        build_train_transforms(DataConfig(train_scales=[]))
    with pytest.raises(ConfigError, match="data.hflip_prob is 1.5"):
        build_train_transforms(DataConfig(hflip_prob=1.5))
    with pytest.raises(ConfigError, match="data.val_scale is 0"):
        build_eval_transforms(DataConfig(val_scale=0))
    # 1 px is below the schema's range (MIN_IMAGE_SIDE), which these checks read.
    with pytest.raises(
        ConfigError, match=r"data.val_max_size is 1; it must hold whole numbers of pixels in \[2, 8192\]"
    ):
        build_eval_transforms(DataConfig(val_max_size=1))
    with pytest.raises(ConfigError, match=r"data.train_scales is \[96, 1\]"):
        build_train_transforms(DataConfig(train_scales=[96, 1]))


def test_config_is_not_modified() -> None:
    cfg = DataConfig()
    before = dataclasses.asdict(cfg)
    build_train_transforms(cfg)
    build_eval_transforms(cfg)
    assert dataclasses.asdict(cfg) == before
