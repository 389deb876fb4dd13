"""CocoDetection on the real coco128 subset and on small datasets written for the test."""

from __future__ import annotations

import json
import logging
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from detr_peg.config.schema import DataConfig
from detr_peg.data import (
    CocoDetection,
    LabelMap,
    build_coco_dataset,
    build_eval_transforms,
    build_train_transforms,
    collate_detection,
)
from detr_peg.errors import ConfigError, DataError
from tests.data.conftest import assert_one_sentence, base_coco, write_json

SMALL_EVAL = DataConfig(val_scale=160, val_max_size=320)
GRAYSCALE_ID = 86
EMPTY_IDS = (250, 508)


def coco128(coco128_dir: Path, name: str = "annotations.json", **kwargs) -> CocoDetection:
    return CocoDetection(images_dir=coco128_dir / "images", annotation_file=coco128_dir / name, **kwargs)


def expected_targets(ann_file: Path, contiguous: bool = True) -> dict[int, tuple[torch.Tensor, list[int]]]:
    """Normalized cxcywh boxes and category ids per image id, computed from the JSON in float64."""
    data = json.loads(ann_file.read_text())
    sizes = {img["id"]: (img["width"], img["height"]) for img in data["images"]}
    out: dict[int, tuple[list, list]] = {img_id: ([], []) for img_id in sizes}
    for ann in data["annotations"]:
        if ann["iscrowd"]:
            continue
        w, h = sizes[ann["image_id"]]
        x, y, bw, bh = ann["bbox"]
        x0, y0 = np.clip(x, 0, w), np.clip(y, 0, h)
        x1, y1 = np.clip(x + bw, 0, w), np.clip(y + bh, 0, h)
        if x1 <= x0 or y1 <= y0:
            continue
        out[ann["image_id"]][0].append([(x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h])
        out[ann["image_id"]][1].append(ann["category_id"])
    return {k: (torch.tensor(b, dtype=torch.float64).reshape(-1, 4), c) for k, (b, c) in out.items()}


def test_lengths(coco128_dir: Path) -> None:
    assert len(coco128(coco128_dir)) == 128
    assert len(coco128(coco128_dir, "annotations_train.json")) == 100
    assert len(coco128(coco128_dir, "annotations_val.json")) == 28


def test_sample_contract(coco128_dir: Path) -> None:
    ds = coco128(coco128_dir, transforms=build_eval_transforms(DataConfig()))
    image, target = ds[0]
    assert type(image) is torch.Tensor and image.dtype == torch.float32
    assert image.shape == (3, 800, 1066)  # 480x640 -> short side 800
    assert set(target) == {"boxes", "labels", "image_id", "orig_size", "size"}
    assert target["image_id"] == ds.ids[0] == 9
    assert target["boxes"].dtype == torch.float32 and target["boxes"].shape == (8, 4)
    assert target["labels"].dtype == torch.int64 and target["labels"].shape == (8,)
    assert target["orig_size"].dtype == torch.int64 and target["orig_size"].tolist() == [480, 640]
    assert target["size"].dtype == torch.int64 and target["size"].tolist() == [800, 1066]
    # roughly ImageNet-normalised values
    assert -2.2 < image.min() < -1.0 and 2.0 < image.max() < 2.7


def test_eval_targets_match_the_annotations(coco128_dir: Path) -> None:
    ds = coco128(coco128_dir, transforms=build_eval_transforms(SMALL_EVAL))
    expected = expected_targets(coco128_dir / "annotations.json")
    crowd_images = 0
    for i in range(len(ds)):
        image, target = ds[i]
        boxes, category_ids = expected[target["image_id"]]
        torch.testing.assert_close(target["boxes"], boxes.float(), rtol=0, atol=2e-6)
        assert ds.label_map.labels_to_category_ids(target["labels"]).tolist() == category_ids
        assert ((target["boxes"] >= 0) & (target["boxes"] <= 1)).all()
        assert target["size"].tolist() == list(image.shape[-2:])
        assert min(image.shape[-2:]) == 160 or max(image.shape[-2:]) == 320
        crowd_images += any(a["iscrowd"] for a in ds.coco.imgToAnns[target["image_id"]])
    assert crowd_images > 0


def test_crowd_annotations_are_left_out_of_targets_but_kept_for_evaluation(coco128_dir: Path) -> None:
    ds = coco128(coco128_dir)
    assert sum(a["iscrowd"] for a in ds.coco.anns.values()) == 10
    for i, image_id in enumerate(ds.ids):
        anns = ds.coco.imgToAnns[image_id]
        if any(a["iscrowd"] for a in anns):
            _, target = ds[i]
            non_crowd = [a for a in anns if not a["iscrowd"]]
            assert len(target["labels"]) == len(non_crowd) < len(anns)


@pytest.mark.parametrize("contiguous", [True, False])
def test_label_mapping_round_trip(coco128_dir: Path, contiguous: bool) -> None:
    ds = coco128(coco128_dir, contiguous_labels=contiguous)
    assert ds.label_map.num_classes == (80 if contiguous else 91)
    expected = expected_targets(coco128_dir / "annotations.json")
    for i in (0, 5, 77):
        _, target = ds[i]
        labels = target["labels"]
        assert labels.max() < ds.label_map.num_classes
        assert ds.label_map.labels_to_category_ids(labels).tolist() == expected[target["image_id"]][1]
        if not contiguous:
            assert labels.tolist() == expected[target["image_id"]][1]
    restored = LabelMap.from_dict(json.loads(json.dumps(ds.label_map.to_dict())))
    assert restored == ds.label_map


def test_grayscale_image_becomes_three_channels(coco128_dir: Path) -> None:
    ds = coco128(coco128_dir)
    index = ds.ids.index(GRAYSCALE_ID)
    with Image.open(ds.image_path(index)) as raw:
        assert raw.mode == "L"
        grey = torch.from_numpy(np.asarray(raw).copy())
    image, target = ds[index]
    assert image.dtype == torch.uint8 and image.shape == (3, *grey.shape)
    for channel in range(3):
        assert torch.equal(image[channel], grey)
    ds.transforms = build_eval_transforms(SMALL_EVAL)
    assert ds[index][0].shape[0] == 3


def test_images_without_annotations(coco128_dir: Path) -> None:
    for transforms in (None, build_train_transforms(DataConfig()), build_eval_transforms(SMALL_EVAL)):
        ds = coco128(coco128_dir, transforms=transforms)
        for image_id in EMPTY_IDS:
            image, target = ds[ds.ids.index(image_id)]
            assert target["boxes"].shape == (0, 4) and target["labels"].shape == (0,)
            assert target["image_id"] == image_id


def test_train_transforms_give_valid_targets(coco128_dir: Path) -> None:
    cfg = DataConfig(train_scales=[96, 128, 160], train_max_size=256, crop_scales=[100, 125, 150], crop_size=[64, 150])
    ds = coco128(coco128_dir, transforms=build_train_transforms(cfg))
    torch.manual_seed(0)
    counts = Counter()
    for step in range(2 * len(ds)):
        image, target = ds[step % len(ds)]
        b = target["boxes"]
        assert b.shape == (len(target["labels"]), 4) and torch.isfinite(b).all()
        assert (b[:, 2:] > 0).all()
        assert (b[:, :2] - b[:, 2:] / 2 >= -1e-6).all() and (b[:, :2] + b[:, 2:] / 2 <= 1 + 1e-6).all()
        assert target["size"].tolist() == list(image.shape[-2:])
        assert max(image.shape[-2:]) <= 256
        counts["boxes"] += len(b)
    assert counts["boxes"] > 1000


def test_collated_batch_from_a_data_loader(coco128_dir: Path) -> None:
    ds = coco128(coco128_dir, transforms=build_eval_transforms(SMALL_EVAL))
    images, mask, targets = next(iter(DataLoader(ds, batch_size=3, collate_fn=collate_detection)))
    assert images.shape[0] == 3 and mask.shape == (3, *images.shape[-2:])
    for i, target in enumerate(targets):
        h, w = target["size"].tolist()
        assert not mask[i, :h, :w].any() and mask[i].sum() == mask.shape[1] * mask.shape[2] - h * w


def test_dataset_pickles(coco128_dir: Path) -> None:
    # Needed by data-loader workers started with "spawn".
    ds = coco128(coco128_dir, transforms=build_train_transforms(DataConfig()))
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.ids == ds.ids and clone.label_map == ds.label_map


def test_build_from_config(coco128_dir: Path) -> None:
    cfg = DataConfig(val_images=str(coco128_dir / "images"), val_annotations=str(coco128_dir / "annotations_val.json"))
    ds = build_coco_dataset(cfg, "val")
    assert len(ds) == 28 and ds.label_map.num_classes == 80
    with pytest.raises(ConfigError, match="data.train_images is not set"):
        build_coco_dataset(cfg, "train")
    with pytest.raises(ConfigError, match="'test'"):
        build_coco_dataset(cfg, "test")


# --- small datasets written into tmp_path ----------------------------------------------------


def test_raw_sample_of_small_dataset(coco_tmp) -> None:
    images_dir, ann_file = coco_tmp()
    ds = CocoDetection(images_dir=images_dir, annotation_file=ann_file)
    assert ds.ids == [1, 2] and ds.label_map.category_ids == [3, 7]
    image, target = ds[0]
    assert image.shape == (3, 30, 40) and image.dtype == torch.uint8
    # [1, 2, 10, 20] -> xyxy; [20, 5, 30, 10] -> clamped to the 40 px width
    torch.testing.assert_close(
        target["boxes"].as_subclass(torch.Tensor), torch.tensor([[1.0, 2.0, 11.0, 22.0], [20.0, 5.0, 40.0, 15.0]])
    )
    assert target["labels"].tolist() == [0, 1]
    _, target = ds[1]  # only a crowd annotation
    assert target["boxes"].shape == (0, 4)


def test_boxes_outside_the_image_are_dropped(coco_tmp) -> None:
    data = base_coco()
    data["annotations"][1]["bbox"] = [45.0, 5.0, 10.0, 10.0]  # starts right of the 40 px image
    images_dir, ann_file = coco_tmp(data)
    ds = CocoDetection(images_dir=images_dir, annotation_file=ann_file)
    _, target = ds[0]
    assert target["labels"].tolist() == [0]
    assert ds.num_boxes_outside == 1  # counted, so a run can report it


def test_missing_image_folder(tmp_path: Path) -> None:
    ann_file = write_json(tmp_path / "ann.json", base_coco())
    with pytest.raises(DataError, match="Image folder .*nowhere does not exist"):
        CocoDetection(images_dir=tmp_path / "nowhere", annotation_file=ann_file)


def test_an_image_missing_from_its_folder_is_found_when_the_file_is_read(coco_tmp, caplog) -> None:
    images_dir, ann_file = coco_tmp()
    (images_dir / "sub" / "b.png").unlink()
    with pytest.raises(DataError) as info:
        CocoDetection(images_dir=images_dir, annotation_file=ann_file)
    assert_one_sentence(str(info.value), str(ann_file), "'sub/b.png'", f"not in the image folder {images_dir}")
    ds = CocoDetection(images_dir=images_dir, annotation_file=ann_file, on_bad_sample="skip")
    assert ds.left_out_ids == [2] and ds.ids == [1]
    assert "sub/b.png" in caplog.text
    (images_dir / "a.png").unlink()  # now neither image is there: the folder is named, not each file
    with pytest.raises(DataError, match=r"None of the 2 images of annotation file .* is in the image folder"):
        CocoDetection(images_dir=images_dir, annotation_file=ann_file, on_bad_sample="skip")


@pytest.mark.parametrize(("listed", "on_disk"), [("caf\u00e9.png", "cafe\u0301.png"), ("A.PNG", "a.png")])
def test_a_name_in_another_unicode_form_or_case_is_pointed_out(coco_tmp, listed, on_disk) -> None:
    data = base_coco()
    data["images"][0]["file_name"] = listed
    images_dir, ann_file = coco_tmp(data)
    (images_dir / listed).rename(images_dir / on_disk)
    with pytest.raises(DataError) as info:
        CocoDetection(images_dir=images_dir, annotation_file=ann_file)
    assert_one_sentence(str(info.value), f"{listed!r}, which is not in the image folder {images_dir} (it holds "
                        f"{on_disk!r}, the same name in another Unicode form or case)")  # fmt: skip


def test_a_link_or_a_folder_in_place_of_an_image_is_named_when_loaded(coco_tmp) -> None:
    images_dir, ann_file = coco_tmp()
    bad = images_dir / "sub" / "b.png"
    bad.unlink()
    bad.symlink_to(images_dir / "gone.png")  # listed in its folder, so reading it says what it is
    ds = CocoDetection(images_dir=images_dir, annotation_file=ann_file)
    with pytest.raises(DataError) as info:
        ds[1]
    assert_one_sentence(str(info.value), str(bad), "gone.png")


@pytest.mark.parametrize("kind", ["removed later", "text", "truncated"])
def test_bad_image_raises_naming_the_file(coco_tmp, kind: str) -> None:
    images_dir, ann_file = coco_tmp()
    bad = images_dir / "sub" / "b.png"
    ds = CocoDetection(images_dir=images_dir, annotation_file=ann_file)
    if kind == "removed later":
        bad.unlink()
    elif kind == "text":
        bad.write_text("not an image")
    else:
        bad.write_bytes(bad.read_bytes()[:200])
    ds[0]
    with pytest.raises(DataError) as info:
        ds[1]
    assert_one_sentence(str(info.value), str(bad))


def test_image_size_must_match_the_annotation_file(coco_tmp) -> None:
    data = base_coco()
    images_dir, ann_file = coco_tmp(data)
    Image.new("RGB", (30, 40)).save(images_dir / "a.png")  # stored rotated: 40 high, 30 wide
    with pytest.raises(DataError) as info:
        CocoDetection(images_dir=images_dir, annotation_file=ann_file)[0]
    assert_one_sentence(str(info.value), str(images_dir / "a.png"), "is 40x30", "says 30x40", "image id 1")


def test_skip_replaces_unreadable_images(coco_tmp, caplog) -> None:
    data = base_coco()
    data["images"].append({"id": 3, "file_name": "c.png", "width": 10, "height": 10})
    images_dir, ann_file = coco_tmp(data)
    (images_dir / "a.png").write_text("garbage")
    ds = CocoDetection(images_dir=images_dir, annotation_file=ann_file, on_bad_sample="skip")
    with caplog.at_level(logging.WARNING):
        _, target = ds[0]
        assert target["image_id"] == 2 and ds.num_skipped == 1
        _, target = ds[0]  # known bad: skipped again without a new count or warning
        assert target["image_id"] == 2 and ds.num_skipped == 1
    warnings = [r.getMessage() for r in caplog.records if "a.png" in r.getMessage()]
    assert len(warnings) == 1
    (images_dir / "c.png").write_text("garbage")
    assert ds[2][1]["image_id"] == 2  # wraps around past the end
    assert ds.num_skipped == 2


def test_skip_gives_up_when_nothing_is_readable(coco_tmp) -> None:
    images_dir, ann_file = coco_tmp()
    for image in (images_dir / "a.png", images_dir / "sub" / "b.png"):
        image.write_text("garbage")
    ds = CocoDetection(images_dir=images_dir, annotation_file=ann_file, on_bad_sample="skip")
    with pytest.raises(DataError, match="None of the 2 images"):
        ds[0]
    assert ds.num_skipped == 2


def test_skip_leaves_out_images_with_invalid_annotations(coco_tmp) -> None:
    data = base_coco()
    data["annotations"][0]["bbox"][2] = float("nan")
    images_dir, ann_file = coco_tmp(data)
    with pytest.raises(DataError, match="annotation id 10"):
        CocoDetection(images_dir=images_dir, annotation_file=ann_file)
    ds = CocoDetection(images_dir=images_dir, annotation_file=ann_file, on_bad_sample="skip")
    assert ds.ids == [2] and ds.num_invalid_skipped == 1
    assert sorted(ds.coco.anns) == [12]


def test_given_label_map_must_cover_the_categories(coco_tmp) -> None:
    images_dir, ann_file = coco_tmp()
    small = LabelMap(category_ids=[3], names=["cat"])
    with pytest.raises(DataError) as info:
        CocoDetection(images_dir=images_dir, annotation_file=ann_file, label_map=small)
    assert_one_sentence(str(info.value), "annotation id 11", "category_id 7")
    wide = LabelMap(category_ids=[1, 3, 7], names=["x", "cat", "dog"])
    ds = CocoDetection(images_dir=images_dir, annotation_file=ann_file, label_map=wide)
    assert ds[0][1]["labels"].tolist() == [1, 2]


def test_a_label_map_that_names_an_id_otherwise_is_warned_of(coco_tmp, caplog) -> None:
    """Results are matched by id: a model whose id 3 is "triangle" scored on a file whose id 3 is "cat" is said."""
    images_dir, ann_file = coco_tmp()
    other = LabelMap(category_ids=[3, 7], names=["triangle", "dog"])
    with caplog.at_level(logging.WARNING):
        CocoDetection(images_dir=images_dir, annotation_file=ann_file, label_map=other)
    assert [r.getMessage() for r in caplog.records] == [
        f"{ann_file} names categories otherwise than the model: id 3 'cat' (the model's 'triangle'); results are "
        "matched by id, so check that the ids mean the same classes."
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        CocoDetection(
            images_dir=images_dir,
            annotation_file=ann_file,
            label_map=LabelMap(category_ids=[3, 7], names=["cat", "dog"]),
        )
    assert not caplog.records


def test_unknown_on_bad_sample(coco_tmp) -> None:
    images_dir, ann_file = coco_tmp()
    with pytest.raises(ConfigError, match="'ignore'"):
        CocoDetection(images_dir=images_dir, annotation_file=ann_file, on_bad_sample="ignore")
