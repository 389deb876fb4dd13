"""Per-class AP and the confusion matrix on coco128's real annotations, with detections made from them."""

from __future__ import annotations

import contextlib
import io
import random
from pathlib import Path

import pytest
from pycocotools.coco import COCO

from detr_peg.engine.evaluation.coco_metrics import coco_stats, run_cocoeval
from detr_peg.engine.evaluation.per_class import confusion_matrix, per_class_ap


@pytest.fixture(scope="module")
def truth(coco128_dir: Path) -> COCO:
    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(str(coco128_dir / "annotations.json"))


def _detections(coco: COCO) -> tuple[list[dict], int, int]:
    """One detection per ground truth: right, of another class, or shifted away; plus low-scoring noise."""
    rng = random.Random(0)
    cat_ids = sorted(coco.getCatIds())
    detections, relabelled, missed = [], 0, 0
    for ann in coco.loadAnns(coco.getAnnIds(iscrowd=False)):
        x, y, w, h = ann["bbox"]
        kind = rng.random()
        category, box = ann["category_id"], [x, y, w, h]
        if kind < 0.2:
            category, relabelled = rng.choice([c for c in cat_ids if c != category]), relabelled + 1
        elif kind < 0.3:
            box, missed = [x + 3 * w + 10, y, w, h], missed + 1  # no overlap with its own ground truth
        detections.append(
            {"image_id": ann["image_id"], "category_id": category, "bbox": box, "score": rng.uniform(0.4, 1)}
        )
        detections.append({"image_id": ann["image_id"], "category_id": category, "bbox": box, "score": 0.1})
    return detections, relabelled, missed


def test_the_mean_of_the_per_class_ap_is_the_ap(truth: COCO) -> None:
    detections, _, _ = _detections(truth)
    evaluator = run_cocoeval(truth, detections)
    rows = per_class_ap(evaluator)
    present = [row for row in rows if row["instances"] > 0]
    assert {row["category_id"] for row in rows} == set(truth.getCatIds())
    assert all(row["AP"] == -1 for row in rows if row["instances"] == 0)
    assert sum(row["AP"] for row in present) / len(present) == pytest.approx(coco_stats(evaluator)["AP"], abs=1e-9)
    assert sum(row["instances"] for row in rows) == len(truth.getAnnIds(iscrowd=False))


def test_the_confusion_matrix_adds_up_to_the_ground_truth_and_the_detections(truth: COCO) -> None:
    detections, relabelled, missed = _detections(truth)
    matrix = confusion_matrix(truth, detections, score=0.3, iou=0.5)
    counts, cat_ids = matrix["counts"], matrix["category_ids"]
    occurring = {a["category_id"] for a in truth.loadAnns(truth.getAnnIds(iscrowd=False))}
    assert cat_ids == sorted(occurring | {d["category_id"] for d in detections if d["score"] >= 0.3})
    assert matrix["names"][-1] == "background" and len(counts) == len(cat_ids) + 1
    for i, cat_id in enumerate(cat_ids):  # every ground truth once, matched or in the background column
        assert sum(counts[i]) == len(truth.getAnnIds(catIds=[cat_id], iscrowd=False))
    kept = [d for d in detections if d["score"] >= 0.3]  # every detection above the threshold once
    assert sum(row[j] for row in counts for j in range(len(cat_ids))) == len(kept)
    diagonal = sum(counts[i][i] for i in range(len(cat_ids)))
    off_diagonal = sum(counts[i][j] for i in range(len(cat_ids)) for j in range(len(cat_ids)) if i != j)
    assert counts[-1][-1] == 0
    # the shifted boxes may still meet another object's ground truth; the relabelled ones meet their own
    assert off_diagonal >= relabelled and diagonal <= len(kept) - relabelled
    assert sum(counts[-1]) <= missed  # background row: detections that matched nothing


def test_a_small_case_gives_the_counts_worked_out_by_hand() -> None:
    coco = COCO()
    coco.dataset = {
        "images": [{"id": 1, "width": 100, "height": 100}, {"id": 2, "width": 100, "height": 100}],
        "categories": [{"id": 3, "name": "cat"}, {"id": 7, "name": "dog"}, {"id": 9, "name": "bird"}],  # no bird
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 3, "bbox": [0, 0, 10, 10], "area": 100, "iscrowd": 0},
            {"id": 2, "image_id": 1, "category_id": 7, "bbox": [50, 50, 20, 20], "area": 400, "iscrowd": 0},
            {"id": 3, "image_id": 2, "category_id": 7, "bbox": [0, 0, 30, 30], "area": 900, "iscrowd": 0},
            {"id": 4, "image_id": 2, "category_id": 3, "bbox": [60, 60, 5, 5], "area": 25, "iscrowd": 1},
        ],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    detections = [
        {"image_id": 1, "category_id": 3, "bbox": [0, 0, 10, 10], "score": 0.9},  # cat as cat
        {"image_id": 1, "category_id": 3, "bbox": [1, 1, 10, 10], "score": 0.8},  # its ground truth is taken
        {"image_id": 1, "category_id": 3, "bbox": [50, 50, 20, 20], "score": 0.7},  # dog seen as cat
        {"image_id": 2, "category_id": 7, "bbox": [0, 0, 30, 30], "score": 0.2},  # under the score threshold
        {"image_id": 2, "category_id": 7, "bbox": [60, 60, 5, 5], "score": 0.9},  # a crowd: not ground truth
    ]
    matrix = confusion_matrix(coco, detections, score=0.3, iou=0.5)
    assert matrix["names"] == ["cat", "dog", "background"] and matrix["category_ids"] == [3, 7]
    assert matrix["counts"] == [[1, 0, 0], [1, 0, 1], [1, 1, 0]]
