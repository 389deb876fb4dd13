"""Datasets, augmentation and batching.

``CocoDetection`` reads COCO-format data and returns ``(image, target)`` with
``image`` ``Tensor[3, H, W]`` (ImageNet-normalised) and ``target["boxes"]``
normalized ``(cx, cy, w, h)`` relative to the unpadded image;
``collate_detection`` pads a batch and returns a mask that is True on padding.
"""

from detr_peg.data.coco_dataset import CocoDetection, build_coco_dataset
from detr_peg.data.coco_file import CocoFile, SampleProblem, read_coco_file
from detr_peg.data.collate import collate_detection
from detr_peg.data.image_file import load_rgb_image
from detr_peg.data.label_map import LabelMap
from detr_peg.data.padding import pad_images
from detr_peg.data.synthetic import SHAPES, SyntheticCoco, generate_synthetic_coco
from detr_peg.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    BoxesToNormalizedCxcywh,
    RandomSizeCrop,
    build_eval_transforms,
    build_train_transforms,
    short_side_resize,
)

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "SHAPES",
    "BoxesToNormalizedCxcywh",
    "CocoDetection",
    "CocoFile",
    "LabelMap",
    "RandomSizeCrop",
    "SampleProblem",
    "SyntheticCoco",
    "build_coco_dataset",
    "build_eval_transforms",
    "build_train_transforms",
    "collate_detection",
    "generate_synthetic_coco",
    "load_rgb_image",
    "pad_images",
    "read_coco_file",
    "short_side_resize",
]
