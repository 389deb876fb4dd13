"""The synthetic shapes dataset: deterministic, valid COCO, shapes really drawn where the boxes say."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.ops import box_iou

from detr_peg.config.schema import DataConfig
from detr_peg.data import SHAPES, CocoDetection, build_train_transforms, generate_synthetic_coco, read_coco_file
from detr_peg.data.synthetic import larger_canvas, read_manifest
from detr_peg.errors import DataError

SMALL = dict(num_train=24, num_val=6, image_size=96, max_objects=5, progress=False)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_files(tmp_path: Path) -> None:
    a = generate_synthetic_coco(tmp_path / "a", seed=3, **SMALL)
    b = generate_synthetic_coco(tmp_path / "b", seed=3, **SMALL)
    c = generate_synthetic_coco(tmp_path / "c", seed=4, **SMALL)
    files_a, files_b, files_c = _files(a.root), _files(b.root), _files(c.root)
    assert len(files_a) == 24 + 6 + 3
    assert files_a == files_b
    assert files_a["annotations_train.json"] != files_c["annotations_train.json"]
    assert files_a["train/000000.png"] != files_c["train/000000.png"]


def test_image_depends_only_on_seed_split_and_index(tmp_path: Path) -> None:
    small = generate_synthetic_coco(tmp_path / "a", **SMALL)
    larger = generate_synthetic_coco(tmp_path / "b", **{**SMALL, "num_train": 30})
    assert (small.train_images / "000023.png").read_bytes() == (larger.train_images / "000023.png").read_bytes()
    assert (small.train_images / "000000.png").read_bytes() != (small.val_images / "000000.png").read_bytes()


@pytest.mark.parametrize("split", ["train", "val"])
def test_valid_coco_with_tight_visible_boxes(tmp_path: Path, split: str) -> None:
    out = generate_synthetic_coco(tmp_path, **SMALL)
    coco = read_coco_file(getattr(out, f"{split}_annotations")).coco  # validation plus pycocotools index
    assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == list(SHAPES)
    assert len(coco.imgs) == SMALL[f"num_{split}"]
    assert len(coco.anns) >= len(coco.imgs)
    used = set()
    for image_id, info in coco.imgs.items():
        with Image.open(getattr(out, f"{split}_images") / info["file_name"]) as img:
            pixels = np.asarray(img.convert("RGB")).astype(int)
        assert pixels.shape == (info["height"], info["width"], 3) == (96, 96, 3)
        anns = coco.imgToAnns[image_id]
        assert 1 <= len(anns) <= 5
        for ann in anns:
            x, y, w, h = ann["bbox"]
            assert ann["iscrowd"] == 0 and 0 <= x and 0 <= y and x + w <= 96 and y + h <= 96
            assert 12 <= w <= 48 and 12 <= h <= 48
            used.add(ann["category_id"])
            colour = pixels[y + h // 2, x + w // 2]
            inside = (pixels[y : y + h, x : x + w] == colour).all(-1)
            # the shape's colour touches all four sides of its box ...
            assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
            # ... fills exactly `area` pixels, and does not appear on the ring just outside it
            assert inside.sum() == ann["area"]
            ring = pixels[max(y - 1, 0) : y + h + 1, max(x - 1, 0) : x + w + 1].copy()
            ring[int(y > 0) : int(y > 0) + h, int(x > 0) : int(x > 0) + w] = -1
            assert not (ring == colour).all(-1).any()
            # the shape stands out from the nearby background
            background = ring[(ring >= 0).all(-1)]
            assert np.abs(background.mean(0) - colour).sum() > 60
    assert used == {1, 2, 3, 4}


def test_reuses_a_matching_dataset_and_regenerates_otherwise(tmp_path: Path) -> None:
    out = generate_synthetic_coco(tmp_path, **SMALL)
    marker = out.train_images / "000000.png"
    stamp = marker.stat().st_mtime_ns
    generate_synthetic_coco(tmp_path, **SMALL)
    assert marker.stat().st_mtime_ns == stamp
    generate_synthetic_coco(tmp_path, **{**SMALL, "num_train": 10})
    assert len(list(out.train_images.glob("*.png"))) == 10
    assert len(json.loads(out.train_annotations.read_text())["images"]) == 10
    (out.train_images / "000003.png").unlink()  # an incomplete folder is regenerated
    generate_synthetic_coco(tmp_path, **{**SMALL, "num_train": 10})
    assert (out.train_images / "000003.png").is_file()


def test_refuses_to_overwrite_foreign_files(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "mine.jpg").write_bytes(b"x")
    with pytest.raises(DataError, match="did not write"):
        generate_synthetic_coco(tmp_path, **SMALL)
    assert (tmp_path / "train" / "mine.jpg").read_bytes() == b"x"


def test_jpeg_output_and_training_pipeline(tmp_path: Path) -> None:
    out = generate_synthetic_coco(tmp_path, image_format="jpg", color_by_class=True, **SMALL)
    cfg = DataConfig(
        **out.data_overrides(), train_scales=[96], train_max_size=96, crop_scales=[64, 80], crop_size=[48, 96]
    )
    ds = CocoDetection(
        images_dir=cfg.train_images, annotation_file=cfg.train_annotations, transforms=build_train_transforms(cfg)
    )
    assert ds.label_map.num_classes == len(SHAPES)
    torch.manual_seed(0)
    for i in range(len(ds)):
        image, target = ds[i]
        assert image.shape[0] == 3 and max(image.shape[-2:]) == 96
        assert ((target["boxes"] >= 0) & (target["boxes"] <= 1)).all()


def test_manifest_without_reference_size_is_reused(tmp_path: Path) -> None:
    """A dataset written before ``reference_size`` existed holds the same files, so it is kept as it is."""
    out = generate_synthetic_coco(tmp_path, **SMALL)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["params"]["reference_size"] == 96 and manifest["object_sides"] == [12, 48]
    del manifest["params"]["reference_size"]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    before = _files(out.root)
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    generate_synthetic_coco(tmp_path, **SMALL)
    assert _files(out.root) == before
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == stamps
    assert read_manifest(tmp_path)["reference_size"] == 96


def _sides_and_counts(annotation_file: Path) -> tuple[np.ndarray, np.ndarray, int]:
    data = json.loads(annotation_file.read_text())
    sides = np.array([a["bbox"][2] for a in data["annotations"]] + [a["bbox"][3] for a in data["annotations"]])
    counts = np.bincount([a["image_id"] for a in data["annotations"]], minlength=len(data["images"]) + 1)[1:]
    (size,) = {img["width"] for img in data["images"]} | {img["height"] for img in data["images"]}
    return sides, counts, size


def test_larger_canvas_keeps_the_object_size_distribution(tmp_path: Path) -> None:
    base = generate_synthetic_coco(
        tmp_path / "base", num_train=1, num_val=150, image_size=64, max_objects=3, seed=5, progress=False
    )
    params = read_manifest(base.root)
    canvas = larger_canvas(params, 2.0, tmp_path / "canvas")
    assert not canvas.train_images.exists() and not canvas.train_annotations.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "canvas"]  # written aside, then renamed
    assert read_manifest(canvas.root) == {
        **params,
        "num_train": 0,
        "image_size": 128,
        "min_objects": 4,
        "max_objects": 12,
    }
    sides, counts, size = _sides_and_counts(base.val_annotations)
    big_sides, big_counts, big_size = _sides_and_counts(canvas.val_annotations)
    assert (size, big_size) == (64, 128)
    # the same bounds in pixels (8 .. 32), reached in both sets
    assert sides.min() == big_sides.min() == 8 and sides.max() == big_sides.max() == 32
    # similar quantiles (sides are uniform on 8..32: the quartiles are 14, 20, 26)
    quantiles = np.quantile(sides, [0.1, 0.25, 0.5, 0.75, 0.9])
    np.testing.assert_allclose(np.quantile(big_sides, [0.1, 0.25, 0.5, 0.75, 0.9]), quantiles, atol=2.5)
    # four times the area, about four times the objects (drawn uniformly from 4..12 instead of 1..3)
    assert 1 <= counts.min() and counts.max() <= 3 and 4 <= big_counts.min() and big_counts.max() <= 12
    assert 3.5 <= big_counts.mean() / counts.mean() <= 4.5
    # generated once: a second call reuses the folder
    stamp = (canvas.root / "manifest.json").stat().st_mtime_ns
    larger_canvas(params, 2.0, tmp_path / "canvas")
    assert (canvas.root / "manifest.json").stat().st_mtime_ns == stamp


def test_default_recipe_gives_balanced_classes_and_separate_whole_boxes(tmp_path: Path) -> None:
    """The demo's recipe (128 px, 1-4 shapes): every class about equally often, no two shapes overlapping."""
    out = generate_synthetic_coco(tmp_path, num_train=200, num_val=10, progress=False)
    data = json.loads(out.train_annotations.read_text())
    assert [image["id"] for image in data["images"]] == list(range(1, 201))
    assert {image["file_name"] for image in data["images"]} == {p.name for p in out.train_images.iterdir()}

    per_image = Counter(ann["image_id"] for ann in data["annotations"])
    assert set(per_image) == set(range(1, 201))  # every image has a shape
    assert set(per_image.values()) == {1, 2, 3, 4}
    per_class = Counter(ann["category_id"] for ann in data["annotations"])
    expected = len(data["annotations"]) / len(SHAPES)
    assert set(per_class) == {1, 2, 3, 4}
    assert all(0.7 * expected <= n <= 1.3 * expected for n in per_class.values()), per_class

    boxes: dict[int, list[list[float]]] = {}
    for ann in data["annotations"]:
        x, y, w, h = ann["bbox"]
        assert 16 <= w == h <= 64 and 0 <= x and 0 <= y and x + w <= 128 and y + h <= 128
        boxes.setdefault(ann["image_id"], []).append([x, y, x + w, y + h])
    for image_id, xyxy in boxes.items():
        iou = box_iou(torch.tensor(xyxy, dtype=torch.float64), torch.tensor(xyxy, dtype=torch.float64))
        torch.testing.assert_close(
            iou,
            torch.eye(len(xyxy), dtype=torch.float64),
            rtol=0,
            atol=0,
            msg=lambda m, i=image_id: f"image {i}: shapes overlap; {m}",
        )
