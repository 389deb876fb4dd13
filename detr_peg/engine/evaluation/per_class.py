"""Per-class AP, read from pycocotools' precision array, and a confusion matrix at one IoU and score threshold."""

from __future__ import annotations

import csv
import io
from collections import Counter, defaultdict

import numpy as np
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torchvision.ops import box_convert, box_iou

from detr_peg.engine.evaluation.metric_units import to_percent

#: The files an evaluation writes beside ``metrics.json``.
PER_CLASS_CSV, CONFUSION_JSON = "per_class.csv", "confusion_matrix.json"
#: A detection counts in the confusion matrix when it scores at least this, matched at this IoU or more.
CONFUSION_SCORE, CONFUSION_IOU = 0.3, 0.5


class Metrics(dict):
    """COCO bbox metrics by name (percent), with the same evaluation's ``per_class`` rows (:func:`per_class_ap`) and
    ``confusion`` matrix (:func:`confusion_matrix`; None outside the main process)."""

    def __init__(self, metrics: dict[str, float], per_class: list[dict], confusion: dict | None) -> None:
        super().__init__(metrics)
        self.per_class, self.confusion = per_class, confusion


def _mean(precision: np.ndarray) -> float:
    defined = precision[precision > -1]
    return float(defined.mean()) if defined.size else -1.0


def per_class_ap(evaluator: COCOeval) -> list[dict]:
    """One row per category: ``category_id``, ``name``, ``instances`` (ground truth, crowds aside), ``AP`` and
    ``AP50`` in percent (-1 without ground truth). The categories' mean AP is ``COCOeval``'s AP."""
    precision = evaluator.eval["precision"]  # [IoU thresholds, recall points, categories, areas, max detections]
    gt, params = evaluator.cocoGt, evaluator.params
    rows = []
    for k, cat_id in enumerate(params.catIds):
        instances = len(gt.getAnnIds(imgIds=params.imgIds, catIds=[cat_id], iscrowd=False))
        ap, ap50 = _mean(precision[:, :, k, 0, -1]), _mean(precision[0, :, k, 0, -1])  # all areas, 100 detections
        name = gt.cats[cat_id].get("name", str(cat_id))
        rows.append({"category_id": int(cat_id), "name": name, "instances": instances, "AP": to_percent(ap),
                     "AP50": to_percent(ap50)})  # fmt: skip
    return rows


def per_class_csv(rows: list[dict]) -> str:
    """The rows of :func:`per_class_ap` as CSV text."""
    out = io.StringIO()
    writer = csv.DictWriter(out, ["category_id", "name", "instances", "AP", "AP50"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _xyxy(items: list[dict]) -> torch.Tensor:
    boxes = torch.tensor([item["bbox"] for item in items], dtype=torch.float64).reshape(-1, 4)
    return box_convert(boxes, "xywh", "xyxy")


def confusion_matrix(
    coco_gt: COCO, results: list[dict], score: float = CONFUSION_SCORE, iou: float = CONFUSION_IOU
) -> dict:
    """Counts of (ground truth class, detected class) over every image of ``coco_gt``, for the classes that have
    ground truth or a counted detection (not N x N for all N categories, mostly zeros); the last row and column are
    the background: detections that match no ground truth, and ground truth that no detection matched.

    Detections scoring at least ``score`` take, highest score first, the unmatched ground truth (crowds aside) of
    largest IoU, when it is at least ``iou``, whatever its class.
    """
    detections = defaultdict(list)
    for result in results:
        if result["score"] >= score:
            detections[result["image_id"]].append(result)
    pairs: Counter = Counter()  # (ground truth class or None, detected class or None) -> count
    for image_id in coco_gt.getImgIds():
        truth = [a for a in coco_gt.imgToAnns[image_id] if not a.get("iscrowd", 0)]
        found = sorted(detections.get(image_id, []), key=lambda d: -d["score"])
        ious = box_iou(_xyxy(found), _xyxy(truth))
        free = torch.ones(len(truth), dtype=torch.bool)
        for i, det in enumerate(found):
            candidates = torch.where(free, ious[i], torch.tensor(-1.0, dtype=ious.dtype))
            j = int(candidates.argmax()) if len(truth) else -1
            if j >= 0 and candidates[j] >= iou:
                free[j] = False
                pairs[truth[j]["category_id"], det["category_id"]] += 1
            else:
                pairs[None, det["category_id"]] += 1
        for j in torch.nonzero(free).flatten().tolist():
            pairs[truth[j]["category_id"], None] += 1
    cat_ids = sorted({c for pair in pairs for c in pair if c is not None})
    index = {**{c: i for i, c in enumerate(cat_ids)}, None: len(cat_ids)}
    counts = np.zeros((len(cat_ids) + 1, len(cat_ids) + 1), dtype=np.int64)
    for (gt, det), n in pairs.items():
        counts[index[gt], index[det]] = n
    names = [coco_gt.cats[c].get("name", str(c)) for c in cat_ids]
    return {"iou": iou, "score_threshold": score, "category_ids": cat_ids, "names": [*names, "background"],
            "rows": "ground truth", "columns": "detections", "counts": counts.tolist()}  # fmt: skip
