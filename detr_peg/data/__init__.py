"""Datasets, augmentation and batching (boxes normalised cxcywh of the unpadded image; masks True on padding).

Names load lazily, so ``detr_peg.data.image_paths`` does not import torch.
"""

from __future__ import annotations

from detr_peg.lazy_exports import lazy_exports as _lazy_exports

_EXPORTS = {
    "CocoDetection": "detr_peg.data.coco_dataset",
    "build_coco_dataset": "detr_peg.data.coco_dataset",
    "CocoFile": "detr_peg.data.coco_file",
    "SampleProblem": "detr_peg.data.coco_file",
    "read_coco_file": "detr_peg.data.coco_file",
    "collate_detection": "detr_peg.data.collate",
    "load_rgb_image": "detr_peg.data.image_input",
    "LabelMap": "detr_peg.data.label_map",
    "pad_images": "detr_peg.data.padding",
    "SHAPES": "detr_peg.data.synthetic",
    "SyntheticCoco": "detr_peg.data.synthetic",
    "generate_synthetic_coco": "detr_peg.data.synthetic",
    "IMAGENET_MEAN": "detr_peg.data.transforms",
    "IMAGENET_STD": "detr_peg.data.transforms",
    "BoxesToNormalizedCxcywh": "detr_peg.data.transforms",
    "RandomSizeCrop": "detr_peg.data.transforms",
    "build_eval_transforms": "detr_peg.data.transforms",
    "build_train_transforms": "detr_peg.data.transforms",
    "short_side_resize": "detr_peg.data.transforms",
}

__all__, __getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
