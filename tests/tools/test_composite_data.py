"""The composite proxy: real objects pasted onto crops of other images, each split from its own sources."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.tools.tool_module import load_tool

TOOL = load_tool("tools/composite_data.py")
SPLITS, CompositeOptions, generate_composites = TOOL.SPLITS, TOOL.CompositeOptions, TOOL.generate_composites


def _source(root: Path, train: int, val: int) -> Path:
    """A COCO-format source: ``train + val`` images, each with three polygon objects of its own colour."""
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    files: dict[str, dict] = {"train": {"images": [], "annotations": []}, "val": {"images": [], "annotations": []}}
    for index in range(train + val):
        split = "train" if index < train else "val"
        image = np.full((120, 160, 3), 40 + index, dtype=np.uint8)
        name = f"{index:03d}.png"
        image_id = 1000 + index
        files[split]["images"].append({"id": image_id, "file_name": name, "width": 160, "height": 120})
        for k in range(3):
            x, y = 10 + 45 * k, 20 + int(rng.integers(0, 40))
            image[y : y + 30, x : x + 30] = (index * 7 % 256, k * 80, 200)
            polygon = [x, y, x + 30, y, x + 30, y + 30, x, y + 30]
            files[split]["annotations"].append({
                "id": 10 * image_id + k, "image_id": image_id, "category_id": 1 + k, "iscrowd": 0,
                "bbox": [x, y, 30, 30], "area": 900, "segmentation": [polygon],
            })  # fmt: skip
        Image.fromarray(image).save(root / "images" / name)
    for split, data in files.items():
        data["categories"] = [{"id": i, "name": f"c{i}"} for i in (1, 2, 3)]
        (root / f"annotations_{split}.json").write_text(json.dumps(data))
    return root


@pytest.fixture(scope="module")
def composites(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("composite")
    source = _source(root / "source", train=10, val=6)
    options = CompositeOptions(size=96, counts=(12, 4, 4, 6), object_sides=(16, 64))
    return root / "out", generate_composites(source, root / "out", options)


def test_no_source_image_or_object_of_the_test_set_is_in_training_or_tuning(composites) -> None:
    out, summary = composites
    sources = {split: set(summary["splits"][split]["source_images"]) for split in SPLITS}
    assert sources["train"] | sources["tune"] == set(range(1000, 1010))
    assert sources["val"] | sources["test"] == set(range(1010, 1016))
    for a in SPLITS:
        for b in SPLITS:
            assert a == b or not sources[a] & sources[b], (a, b)
    for split in SPLITS:
        data = json.loads((out / f"annotations_{split}.json").read_text())
        used_images = {image["source_background"] for image in data["images"]}
        used_objects = {ann["source_annotation"] for ann in data["annotations"]}
        assert used_images <= sources[split]
        assert {o // 10 for o in used_objects} <= sources[split]  # a source object's id is 10 x its image's
        assert len(data["images"]) == summary["splits"][split]["images"]


def test_boxes_are_the_visible_parts_and_the_statistics_count_them(composites) -> None:
    out, summary = composites
    data = json.loads((out / "annotations_train.json").read_text())
    assert [img["id"] for img in data["images"]] == list(range(1, 13))
    assert [ann["id"] for ann in data["annotations"]] == list(range(1, len(data["annotations"]) + 1))
    for ann in data["annotations"]:
        x, y, w, h = ann["bbox"]
        assert 0 <= x and 0 <= y and x + w <= 96 and y + h <= 96
        assert 0 < ann["area"] <= w * h
    stats = summary["splits"]["train"]
    assert stats["objects"] == len(data["annotations"]) == sum(stats["small_medium_large"])
    assert stats["token_grid_stride16"] == [6, 6]


def test_the_same_options_give_the_same_images(composites, tmp_path: Path) -> None:
    out, summary = composites
    again = generate_composites(Path(summary["source"]), tmp_path / "again", CompositeOptions(**{
        **summary["options"], "counts": tuple(summary["options"]["counts"]),
        "objects": tuple(summary["options"]["objects"]), "object_sides": tuple(summary["options"]["object_sides"]),
    }))  # fmt: skip
    assert again["splits"] == summary["splits"]
    for split in SPLITS:
        assert (tmp_path / "again" / f"annotations_{split}.json").read_bytes() == (
            out / f"annotations_{split}.json"
        ).read_bytes()
