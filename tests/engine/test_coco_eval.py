"""COCO results with the dataset's category ids, COCOeval numbers, shard merging."""

from __future__ import annotations

import json

import pytest
import torch
from pycocotools.coco import COCO

from detr_peg.data.coco_file import read_coco_file
from detr_peg.data.label_map import LabelMap
from detr_peg.engine.evaluation.coco_metrics import STAT_NAMES, detections_to_coco, evaluate_coco, format_metrics_table
from detr_peg.engine.evaluation.evaluate import merge_shards

# Two images, categories 3 ("cat") and 7 ("dog"): non-contiguous ids.
GT = {
    "images": [
        {"id": 1, "width": 200, "height": 100, "file_name": "a.png"},
        {"id": 5, "width": 120, "height": 120, "file_name": "b.png"},
    ],
    "annotations": [
        {"id": 1, "image_id": 1, "category_id": 3, "bbox": [10, 10, 50, 40], "area": 2000, "iscrowd": 0},
        {"id": 2, "image_id": 1, "category_id": 7, "bbox": [100, 20, 60, 70], "area": 4200, "iscrowd": 0},
        {"id": 3, "image_id": 5, "category_id": 7, "bbox": [0, 0, 120, 100], "area": 12000, "iscrowd": 0},
    ],
    "categories": [{"id": 7, "name": "dog"}, {"id": 3, "name": "cat"}],
}


def _coco() -> COCO:
    coco = COCO()
    coco.dataset = {k: [dict(v) for v in vs] for k, vs in GT.items()}
    coco.createIndex()
    return coco


def _xyxy(bbox):
    x, y, w, h = bbox
    return [x, y, x + w, y + h]


def _perfect(label_map: LabelMap):
    per_image = {}
    for ann in GT["annotations"]:
        per_image.setdefault(ann["image_id"], []).append(ann)
    ids = sorted(per_image)
    dets = [
        {
            "boxes": torch.tensor([_xyxy(a["bbox"]) for a in per_image[i]], dtype=torch.float32),
            "labels": torch.tensor([label_map.label_of(a["category_id"]) for a in per_image[i]]),
            "scores": torch.tensor([0.9] * len(per_image[i])),
        }
        for i in ids
    ]
    return ids, dets


def test_ground_truth_as_detections_scores_one_with_original_category_ids() -> None:
    label_map = LabelMap.from_coco_categories(GT["categories"], contiguous=True)
    ids, dets = _perfect(label_map)
    results = detections_to_coco(ids, dets, label_map)
    assert sorted((r["image_id"], r["category_id"]) for r in results) == [(1, 3), (1, 7), (5, 7)]
    assert {tuple(r["bbox"]) for r in results} == {tuple(map(float, a["bbox"])) for a in GT["annotations"]}
    metrics = evaluate_coco(_coco(), results)
    assert list(metrics) == list(STAT_NAMES)
    assert metrics["AP"] == 100.0 and metrics["AP50"] == 100.0 and metrics["AR100"] == 100.0  # percent
    assert metrics["APs"] == -1.0  # no small objects: COCO defines no value
    table = format_metrics_table(metrics)
    assert all(name in table for name in STAT_NAMES) and "n/a" in table
    assert table.splitlines()[0] == "COCO bbox evaluation, in percent"
    assert "AP     100.0 %   AP @ IoU=0.50:0.95" in table and "ARs        n/a   AR small" in table


def test_raw_labels_that_are_no_category_are_left_out() -> None:
    label_map = LabelMap.from_coco_categories(GT["categories"], contiguous=False)  # 8 labels, 2 categories
    det = {
        "boxes": torch.tensor([[0.0, 0, 10, 10]] * 3),
        "labels": torch.tensor([3, 4, 7]),
        "scores": torch.tensor([0.5, 0.6, 0.7]),
    }
    results = detections_to_coco([1], [det], label_map)
    assert [r["category_id"] for r in results] == [3, 7]


def test_no_detection_gives_zeros() -> None:
    assert evaluate_coco(_coco(), []) == {name: 0.0 for name in STAT_NAMES}


def test_shards_are_merged_once_per_image() -> None:
    a = [(1, [{"image_id": 1, "score": 0.1}]), (3, [])]
    b = [(2, [{"image_id": 2, "score": 0.2}]), (1, [{"image_id": 1, "score": 0.9}])]  # 1 repeated as padding
    merged, count = merge_shards([a, b])
    assert count == 3
    assert merged == [{"image_id": 1, "score": 0.1}, {"image_id": 2, "score": 0.2}]


def _variant(name: str) -> dict:
    """GT as a file might hold it: ids from 1 (as written), from 0, without ``iscrowd`` or ``area``."""
    data = {k: [dict(v) for v in vs] for k, vs in GT.items()}
    for index, ann in enumerate(data["annotations"]):
        if name == "ids from 0":
            ann["id"] = index
        elif name == "ids from 0, reversed":
            ann["id"] = len(data["annotations"]) - 1 - index
        elif name == "no iscrowd":
            del ann["iscrowd"]
        elif name == "no area":
            del ann["area"]
    return data


#: Detections of GT: one box exact, one shifted (IoU about 0.6), one missing, one false positive.
DETECTIONS = [
    {"image_id": 1, "category_id": 3, "bbox": [10, 10, 50, 40], "score": 0.9},
    {"image_id": 1, "category_id": 7, "bbox": [110, 30, 60, 70], "score": 0.8},
    {"image_id": 5, "category_id": 3, "bbox": [0, 0, 50, 50], "score": 0.7},
]


@pytest.mark.parametrize("variant", ["ids from 0", "ids from 0, reversed", "no iscrowd", "no area"])
def test_the_same_ground_truth_gives_the_same_metrics_however_the_file_writes_it(tmp_path, variant: str) -> None:
    """Rule: annotations are normalised where they are read (ids pycocotools cannot take for "no match",
    ``iscrowd`` and ``area`` by the COCO rules), so AP does not depend on how the file numbers or omits them."""
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps(_variant("as written")))
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(_variant(variant)))
    expected = evaluate_coco(read_coco_file(reference).coco, [dict(d) for d in DETECTIONS])
    assert 0 < expected["AP"] < 100 and 0 < expected["AR100"] < 100  # a score that a lost match would change
    assert evaluate_coco(read_coco_file(changed).coco, [dict(d) for d in DETECTIONS]) == expected
