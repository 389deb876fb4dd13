"""Every config in ``configs/timm`` trains a few iterations and evaluates on the CPU.

Each config is loaded as a user would load it, shrunk to a small transformer
(width 32, one encoder and one decoder layer, 5 queries) with the config's own
timm backbone, trained for three AdamW steps on random images with boxes, and
evaluated: post-processed detections are scored by pycocotools' COCOeval
against a COCO-format ground truth written to ``tmp_path``. A new config in
``configs/timm`` is tested without touching this file.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torchvision.ops import box_convert

from detr_peg.config import load_config
from detr_peg.models import build_criterion, build_model, build_postprocessor
from detr_peg.models.registry import MODELS

CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs" / "timm"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))

NUM_CLASSES = 4  # category ids 1..3 are used; DETR-style raw ids leave 0 unused
SMALL = [
    f"model.num_classes={NUM_CLASSES}",
    "model.num_queries=5",
    "model.transformer.hidden_dim=32",
    "model.transformer.nheads=2",
    "model.transformer.enc_layers=1",
    "model.transformer.dec_layers=1",
    "model.transformer.dim_feedforward=64",
    "model.transformer.dropout=0.0",
]
#: Deformable-DETR's own options (an error with DETR).
SMALL_DEFORMABLE = ["model.transformer.enc_n_points=2", "model.transformer.dec_n_points=2"]


def small_overrides(config: Path) -> list[str]:
    """:data:`SMALL`, plus :data:`SMALL_DEFORMABLE` for a Deformable-DETR config."""
    return SMALL + (SMALL_DEFORMABLE if load_config(config).model.arch == "deformable_detr" else [])


SIZES = [(64, 80), (72, 64)]  # (h, w) of the synthetic images


def synthetic_batch(seed: int = 0) -> tuple[list[torch.Tensor], list[dict], list[list[list[float]]]]:
    """Random images with 1-2 boxes each.

    Returns:
        ``(images, targets, pixel_boxes)``: images ``Tensor[3, H, W]``; targets
        with ``labels`` (int64, ids 1..3) and ``boxes`` normalised (cx, cy, w, h)
        relative to the image; the same boxes as absolute pixel (x, y, w, h).
    """
    g = torch.Generator().manual_seed(seed)
    images, targets, pixel_boxes = [], [], []
    for i, (h, w) in enumerate(SIZES):
        images.append(torch.randn(3, h, w, generator=g))
        n = 1 + i
        xyxy = torch.tensor([[0.1, 0.2, 0.6, 0.7], [0.4, 0.3, 0.9, 0.8]][:n])
        targets.append(
            {"labels": torch.tensor([1, 3][:n], dtype=torch.int64), "boxes": box_convert(xyxy, "xyxy", "cxcywh")}
        )
        scale = torch.tensor([w, h, w, h], dtype=torch.float32)
        pixel_boxes.append(box_convert(xyxy * scale, "xyxy", "xywh").tolist())
    return images, targets, pixel_boxes


def write_coco_ground_truth(path: Path, pixel_boxes: list[list[list[float]]], labels: list[list[int]]) -> None:
    images, annotations = [], []
    for image_id, ((h, w), boxes, cats) in enumerate(zip(SIZES, pixel_boxes, labels), start=1):
        images.append({"id": image_id, "height": h, "width": w, "file_name": f"{image_id}.png"})
        for box, cat in zip(boxes, cats):
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": cat,
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": 0,
                }
            )
    categories = [{"id": c, "name": f"class{c}"} for c in range(1, NUM_CLASSES)]
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))


def coco_eval(gt_path: Path, detections: list[dict]) -> list[float]:
    """The 12 COCOeval bbox metrics (AP, AP50, ..., AR_large)."""
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(gt_path))
        evaluator = COCOeval(gt, gt.loadRes(detections), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return [float(v) for v in evaluator.stats]


def test_there_are_timm_configs_for_each_family():
    names = {p.stem for p in CONFIGS}
    assert any("resnet50" in n for n in names)
    assert any("convnext" in n for n in names)
    assert any("twins_pcpvt" in n for n in names)


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_timm_config_trains_and_evaluates(config, tmp_path):
    cfg = load_config(config, small_overrides(config))
    assert cfg.model.backbone.source == "timm"
    assert cfg.model.backbone.weights in (None, "pretrained") or Path(cfg.model.backbone.weights).is_file()
    # A config naming an architecture that is not registered is a regression, not a reason to skip.
    assert cfg.model.arch in MODELS, f"{config.name}: model.arch {cfg.model.arch!r} is not one of {MODELS.names()}"
    cfg.model.backbone.weights = None  # never download in tests

    torch.manual_seed(0)
    model = build_model(cfg)
    criterion = build_criterion(cfg)
    postprocess = build_postprocessor(cfg)
    images, targets, pixel_boxes = synthetic_batch()

    # Train: three AdamW steps; frozen backbone parameters stay put, trainable ones move.
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert any(n.startswith("backbone.") for n in trainable)
    assert any(n.startswith("backbone.") for n in frozen) == (cfg.model.backbone.frozen_stages > 0)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, weight_decay=1e-4)
    model.train()
    for _ in range(3):
        losses = criterion(model(images), targets)
        total = criterion.weighted_total(losses)
        assert math.isfinite(total.item()), {k: v.item() for k, v in losses.items()}
        optimizer.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip_max_norm)
        optimizer.step()
    params = dict(model.named_parameters())
    moved = [n for n, before in trainable.items() if not torch.equal(params[n], before)]
    assert any(n.startswith("backbone.") for n in moved)
    assert any(n.startswith("transformer.") for n in moved)
    for name, before in frozen.items():
        torch.testing.assert_close(params[name], before, rtol=0, atol=0)

    # Evaluate: detections in original pixels, scored by COCOeval.
    model.eval()
    with torch.no_grad():
        outputs = model(images)
    sizes = torch.tensor(SIZES)
    results = postprocess(outputs, sizes)
    detections = []
    for image_id, (result, (h, w)) in enumerate(zip(results, SIZES), start=1):
        boxes = result["boxes"]
        assert boxes.shape[-1] == 4 and torch.isfinite(boxes).all()
        assert (boxes[:, 0::2] >= -1e-3).all() and (boxes[:, 0::2] <= w + 1e-3).all()
        assert (boxes[:, 1::2] >= -1e-3).all() and (boxes[:, 1::2] <= h + 1e-3).all()
        for box, score, label in zip(
            box_convert(boxes, "xyxy", "xywh").tolist(), result["scores"].tolist(), result["labels"].tolist()
        ):
            detections.append({"image_id": image_id, "category_id": int(label), "bbox": box, "score": score})
    gt_path = tmp_path / "ground_truth.json"
    write_coco_ground_truth(gt_path, pixel_boxes, [t["labels"].tolist() for t in targets])
    stats = coco_eval(gt_path, detections)
    assert len(stats) == 12
    assert all(v == -1.0 or 0.0 <= v <= 1.0 for v in stats), stats
