"""Adding an architecture is one new module: its registration carries everything the rest of the code needs.

A toy detector (a ResNet-18 cut at stride 8, masked average pooling, linear class and box heads) is written
into a temporary folder, imported, and then trained for two iterations, evaluated, used through
``detr_peg.Detector`` (from the checkpoint it wrote) and exported to ONNX, with no edit anywhere else.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.conftest import run_python

TOY_MODULE = '''
"""A toy detector: pooled backbone features, one linear head per output."""

import torch
from torch import nn

from detr_peg.models.backbones import build_backbone
from detr_peg.models.criterion import SetCriterion, build_weight_dict
from detr_peg.models.masking import batch_with_mask, level_masks
from detr_peg.models.matcher import HungarianMatcher
from detr_peg.models.postprocess import PostProcess
from detr_peg.models.registry import Architecture, register_architecture


class ToyDetector(nn.Module):
    def __init__(self, *, backbone, num_classes, num_queries):
        super().__init__()
        self.backbone = backbone
        self.num_queries, self.num_classes = num_queries, num_classes
        self.feature_strides = [backbone.strides[-1]]
        self.class_head = nn.Linear(backbone.out_channels[-1], num_queries * (num_classes + 1))
        self.box_head = nn.Linear(backbone.out_channels[-1], num_queries * 4)

    @property
    def size_divisibility(self):
        return max(self.feature_strides)

    def forward(self, images, mask=None):
        images, mask = batch_with_mask(images, mask, self.size_divisibility)
        feature = self.backbone(images)[-1]
        (valid,) = level_masks(mask, [feature.shape[-2:]], self.feature_strides)
        weights = (~valid).unsqueeze(1).to(feature.dtype)
        pooled = (feature * weights).sum((2, 3)) / weights.sum((2, 3)).clamp_min(1)
        b = pooled.shape[0]
        logits = self.class_head(pooled).view(b, self.num_queries, self.num_classes + 1)
        boxes = self.box_head(pooled).view(b, self.num_queries, 4).sigmoid()
        return {"pred_logits": logits, "pred_boxes": boxes}


def build_toy(model):  # the config's model section
    backbone = build_backbone(model.backbone, [2])
    return ToyDetector(backbone=backbone, num_classes=model.num_classes, num_queries=model.num_queries)


def build_toy_criterion(cfg):
    matcher = HungarianMatcher(cost_class=1, cost_bbox=5, cost_giou=2, class_cost="softmax")
    weights = build_weight_dict(ce=1, bbox=5, giou=2, num_aux=0, two_stage=False)
    return SetCriterion(
        num_classes=cfg.model.num_classes, matcher=matcher, weight_dict=weights, class_loss="ce", eos_coef=0.1
    )


register_architecture(
    "toy",
    Architecture(build_model=build_toy, build_criterion=build_toy_criterion, build_postprocessor=lambda cfg: PostProcess()),
)
'''

SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import toy_architecture  # registers model.arch=toy

import detr_peg
from detr_peg.data.synthetic import generate_synthetic_coco
from pathlib import Path

root = Path(sys.argv[1])
data = generate_synthetic_coco(root / "data", num_train=4, num_val=3, image_size=64, progress=False)
overrides = [
    "model.arch=toy", "model.num_queries=5", "model.backbone.name=resnet18", "model.backbone.weights=null",
    "model.backbone.norm=bn", "model.backbone.frozen_stages=0", "train.batch_size=2", "train.max_iters=2",
    "train.device=cpu", "data.num_workers=0", "data.train_scales=[64]", "data.train_max_size=96",
    "data.crop_scales=[64]", "data.crop_size=[48,64]", "data.val_scale=64", "data.val_max_size=96",
    f"train.output_dir={root / 'run'}", *[f"data.{k}={v}" for k, v in data.data_overrides().items()],
]
result = detr_peg.run_training(detr_peg.load_config(None, overrides))
detector = detr_peg.Detector.from_checkpoint(result.checkpoint, device="cpu")
images = sorted(data.val_images.glob("*.png"))
found = detector.predict(images, threshold=0.0)
metrics = detector.evaluate(data.val_images, data.val_annotations)
report = {
    "iterations": result.iterations,
    "train_metrics": result.metrics,
    "detections": [len(d) for d in found],
    "names": sorted({n for d in found for n in d.class_names}),
    "metrics": metrics,
    "repr": repr(detector),
}
if sys.argv[2] == "onnx":
    in_onnx = detr_peg.Detector.from_onnx(detector.export_onnx(root / "toy.onnx", optimize=False))
    again = in_onnx.predict(images, threshold=0.0)
    report["onnx_max_box_difference"] = max(float((a.boxes - b.boxes).abs().max()) for a, b in zip(again, found))
    report["onnx_max_score_difference"] = max(float((a.scores - b.scores).abs().max()) for a, b in zip(again, found))
print("REPORT " + json.dumps(report))
"""


def test_a_toy_architecture_in_one_new_module_trains_evaluates_predicts_and_exports(tmp_path) -> None:
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401

        export = "onnx"
    except ImportError:
        export = "none"
    (tmp_path / "toy_architecture.py").write_text(textwrap.dedent(TOY_MODULE))
    proc = run_python("-c", SCRIPT, str(tmp_path), export)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.rsplit("REPORT ", 1)[1])
    assert report["iterations"] == 2
    assert report["detections"] == [5, 5, 5]  # one per query, every score kept
    assert set(report["names"]) <= {"circle", "square", "triangle", "cross"} and report["names"]
    assert set(report["metrics"]) == set(report["train_metrics"]) and 0 <= report["metrics"]["AP50"] <= 100
    assert report["metrics"] == pytest.approx(report["train_metrics"], abs=1e-12)  # the run's final evaluation
    assert report["repr"].startswith("Detector(toy, ")
    if export == "onnx":
        assert report["onnx_max_box_difference"] < 1e-3 and report["onnx_max_score_difference"] < 1e-5
