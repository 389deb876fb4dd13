"""One training size per batch (``data.train_size_per=batch``): drawn per step, the same in every process and after a resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchvision import tv_tensors

from detr_peg.data.coco_dataset import build_coco_dataset
from detr_peg.data.epoch_samples import EpochSampleDataset
from detr_peg.data.transforms import resize_sample, short_side_resize
from detr_peg.engine.distributed import DistEnv
from detr_peg.engine.loader import EpochBatchSampler, build_train_loader
from detr_peg.errors import ConfigError
from tests.engine.tiny_run import synthetic_data, synthetic_overrides, tiny_config

SIZES = (32, 40, 48, 56, 64)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return synthetic_data(tmp_path_factory.mktemp("shapes"), num_train=16).root


def _config(shapes: Path, tmp: Path, per: str, *extra: str):
    data = synthetic_data(shapes, num_train=16)  # already written: returns the paths
    scales = "[" + ",".join(str(s) for s in SIZES) + "]"
    return tiny_config(
        synthetic_overrides(
            data, tmp, f"data.train_size_per={per}", f"data.train_scales={scales}", "data.train_max_size=64",
            "data.crop_prob=0", "train.batch_size=4", "train.seed=3", *extra,
        )
    )  # fmt: skip


def test_the_sampler_gives_every_key_of_a_batch_one_size_the_same_in_every_process_and_after_a_resume() -> None:
    def keys(**kw):
        return list(EpochBatchSampler(num_samples=64, batch_size=4, epoch=2, seed=7, sizes=SIZES, **kw))

    full = keys()
    sizes = [batch[0][2] for batch in full]
    assert all({key[2] for key in batch} == {size} for batch, size in zip(full, sizes))
    assert set(sizes) <= set(SIZES) and len(set(sizes)) >= 3  # 16 batches draw several sizes
    halves = [list(EpochBatchSampler(num_samples=64, batch_size=2, epoch=2, seed=7, sizes=SIZES, rank=r,
                                     world_size=2)) for r in range(2)]  # fmt: skip
    assert [b[0][2] for b in halves[0]] == [b[0][2] for b in halves[1]] == sizes
    assert keys(start_batch=5) == full[5:]
    other_epoch = list(EpochBatchSampler(num_samples=64, batch_size=4, epoch=3, seed=7, sizes=SIZES))
    assert [b[0][2] for b in other_epoch] != sizes
    # Without sizes the keys are (epoch, index), as before.
    plain = list(EpochBatchSampler(num_samples=64, batch_size=4, epoch=2, seed=7))
    assert [[k[:2] for k in batch] for batch in full] == plain


def test_a_key_with_a_size_resizes_the_sample_and_keeps_its_boxes(shapes: Path, tmp_path: Path) -> None:
    ds = EpochSampleDataset(build_coco_dataset(_config(shapes, tmp_path, "batch").data, "train"), seed=3, max_size=64)
    native, native_target = ds[(0, 5)]
    assert native.shape[-2:] == (64, 64)  # no resize in the pipeline: the synthetic images are 64 x 64
    image, target = ds[(0, 5, 40)]
    assert image.shape == (3, 40, 40)
    torch.testing.assert_close(target["size"], torch.tensor([40, 40]))
    torch.testing.assert_close(target["boxes"], native_target["boxes"])  # normalised cxcywh: unchanged
    expected = torch.nn.functional.interpolate(native[None], size=(40, 40), mode="bilinear", antialias=True)[0]
    torch.testing.assert_close(image, expected, atol=1e-5, rtol=0)
    capped, _ = ds[(0, 5, 96)]  # a short side at or above the cap: the long side becomes the cap
    assert capped.shape == (3, 64, 64)


def test_a_batch_level_loader_gives_one_size_per_batch_and_several_over_an_epoch(shapes: Path, tmp_path: Path) -> None:
    cfg = _config(shapes, tmp_path, "batch")
    loader = build_train_loader(build_coco_dataset(cfg.data, "train"), cfg, DistEnv(), epoch=0, size_divisibility=8)
    shapes_seen = []
    for images, mask, targets in loader:
        sides = {tuple(t["size"].tolist()) for t in targets}
        assert len(sides) == 1  # one size for the whole batch
        ((h, w),) = sides
        assert images.shape[-2:] == (-(-h // 8) * 8, -(-w // 8) * 8)
        assert not mask[:, :h, :w].any() and mask[:, h:, :].all() and mask[:, :, w:].all()
        shapes_seen.append(h)
    assert len(shapes_seen) == 4 and set(shapes_seen) <= set(SIZES) and len(set(shapes_seen)) >= 2
    per_image = _config(shapes, tmp_path, "image")
    loader = build_train_loader(build_coco_dataset(per_image.data, "train"), per_image, DistEnv(), epoch=0,
                                size_divisibility=8)  # fmt: skip
    mixed = [len({tuple(t["size"].tolist()) for t in targets}) for _, _, targets in loader]
    assert max(mixed) > 1  # per image, a batch mixes sizes


def test_an_unknown_train_size_per_is_refused(shapes: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="train_size_per"):
        _config(shapes, tmp_path, "epoch")


@pytest.mark.parametrize(("short", "max_size"), [(30, 128), (40, 128), (64, 100), (70, 90), (96, 64)])
def test_resize_sample_follows_the_short_side_rule_of_the_per_image_resize_on_a_non_square_image(
    short: int, max_size: int
) -> None:
    """The size one batch-level draw gives a 50 x 100 image is the one the per-image resize gives it."""
    image = torch.rand(3, 50, 100)
    boxes = torch.tensor([[0.5, 0.5, 0.2, 0.4]])
    resized, target = resize_sample(image, {"boxes": boxes, "size": torch.tensor([50, 100])}, short, max_size)
    expected = short_side_resize([short], max_size)(tv_tensors.Image(image)).shape[-2:]
    assert resized.shape[-2:] == expected
    torch.testing.assert_close(target["size"], torch.tensor(list(expected)))
    torch.testing.assert_close(target["boxes"], boxes)
