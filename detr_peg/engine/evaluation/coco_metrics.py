"""COCO bbox evaluation with pycocotools, and detections in the COCO results format."""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import Tensor

from detr_peg.data.label_map import LabelMap
from detr_peg.engine.evaluation.metric_units import STAT_NAMES, format_percent, to_percent

__all__ = ["STAT_NAMES", "detections_to_coco", "evaluate_coco", "format_metrics_table"]

_DESCRIPTIONS = {
    "AP": "AP @ IoU=0.50:0.95, all areas, 100 dets",
    "AP50": "AP @ IoU=0.50",
    "AP75": "AP @ IoU=0.75",
    "APs": "AP small (area < 32^2)",
    "APm": "AP medium (32^2 .. 96^2)",
    "APl": "AP large (area > 96^2)",
    "AR1": "AR, 1 detection per image",
    "AR10": "AR, 10 detections per image",
    "AR100": "AR, 100 detections per image",
    "ARs": "AR small",
    "ARm": "AR medium",
    "ARl": "AR large",
}


def detections_to_coco(
    image_ids: Sequence[int], detections: Sequence[dict[str, Tensor]], label_map: LabelMap
) -> list[dict]:
    """Post-processed detections (``boxes`` xyxy pixels of the stored image) as COCO results of ``image_ids``.

    Each ``{"image_id", "category_id", "bbox": [x, y, w, h], "score"}`` with the dataset's category id, boxes
    rounded to 0.01 px, scores to 1e-5; labels that are no category of ``label_map`` are left out.
    """
    results: list[dict] = []
    valid = torch.tensor(
        [label_map.contiguous or label_map.has_category(label) for label in range(label_map.num_classes)],
        dtype=torch.bool,
    )
    for image_id, det in zip(image_ids, detections):
        labels = det["labels"].detach().cpu().long()
        keep = valid[labels.clamp(0, label_map.num_classes - 1)] & (labels < label_map.num_classes)
        if not bool(keep.any()):
            continue
        boxes = det["boxes"].detach().cpu().double()[keep]
        xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1)
        cats = label_map.labels_to_category_ids(labels[keep]).tolist()
        scores = det["scores"].detach().cpu().double()[keep].tolist()
        for box, cat, score in zip(xywh.tolist(), cats, scores):
            results.append(
                {
                    "image_id": int(image_id),
                    "category_id": int(cat),
                    "bbox": [round(v, 2) for v in box],
                    "score": round(float(score), 5),
                }
            )
    return results


def evaluate_coco(coco_gt: COCO, results: list[dict], image_ids: Iterable[int] | None = None) -> dict[str, float]:
    """``COCOeval`` (bbox) over ``image_ids`` (default: all): :data:`STAT_NAMES` in percent.

    Images without detections count as misses; ``-1`` where COCO defines no value; all ``0`` without any detection.
    """
    return coco_stats(run_cocoeval(coco_gt, results, image_ids))


def coco_stats(evaluator: COCOeval | None) -> dict[str, float]:
    """:data:`STAT_NAMES` in percent of a summarised ``COCOeval``; all ``0`` for None (no detection)."""
    if evaluator is None:
        return {name: 0.0 for name in STAT_NAMES}
    return {name: to_percent(value) for name, value in zip(STAT_NAMES, np.asarray(evaluator.stats).tolist())}


def run_cocoeval(coco_gt: COCO, results: list[dict], image_ids: Iterable[int] | None = None) -> COCOeval | None:
    """``COCOeval`` (bbox) evaluated, accumulated and summarised over ``image_ids`` (default: all); None without
    results."""
    ids = sorted(coco_gt.getImgIds() if image_ids is None else set(image_ids))
    if not results:
        return None
    with contextlib.redirect_stdout(io.StringIO()):
        # loadRes adds fields (id, area) to the dicts it is given.
        dt = coco_gt.loadRes(copy.deepcopy(results))
        evaluator = COCOeval(coco_gt, dt, iouType="bbox")
        evaluator.params.imgIds = ids
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator


def format_metrics_table(metrics: dict[str, float], title: str = "COCO bbox evaluation") -> str:
    """The metrics (percent) as an aligned text table: ``AP      37.5 %   AP @ IoU=0.50:0.95, ...``."""
    rows = [f"{title}, in percent", "-" * 52]
    for name in STAT_NAMES:
        if name in metrics:
            rows.append(f"{name:<6} {format_percent(metrics[name], 7)}   {_DESCRIPTIONS[name]}")
    return "\n".join(rows)
