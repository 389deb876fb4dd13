"""A detectron2 dataset mapper with DETR's augmentation (flip, random resize or resize-crop-resize)."""

from __future__ import annotations

import copy

import numpy as np
import torch
from detectron2.config import configurable
from detectron2.data import detection_utils as utils
from detectron2.data import transforms as T


class DetrPegDatasetMapper:
    """Map a detectron2 dataset dict to ``image`` and (training) ``instances``; ``crop_prob`` picks the crop branch."""

    @configurable
    def __init__(
        self,
        *,
        is_train: bool,
        augmentations: list[T.Augmentation],
        crop_augmentations: list[T.Augmentation] | None = None,
        crop_prob: float = 0.5,
        image_format: str = "RGB",
    ) -> None:
        self.is_train = is_train
        self.augmentations = T.AugmentationList(augmentations)
        self.crop_augmentations = None if crop_augmentations is None else T.AugmentationList(crop_augmentations)
        self.crop_prob = crop_prob
        self.image_format = image_format

    @classmethod
    def from_config(cls, cfg, is_train: bool = True) -> dict:
        inp = cfg.INPUT
        if not is_train:
            resize = T.ResizeShortestEdge(inp.MIN_SIZE_TEST, inp.MAX_SIZE_TEST, "choice")
            return {"is_train": False, "augmentations": [resize], "image_format": inp.FORMAT}
        flip = [T.RandomFlip(horizontal=True, vertical=False)] if inp.RANDOM_FLIP == "horizontal" else []
        resize = T.ResizeShortestEdge(inp.MIN_SIZE_TRAIN, inp.MAX_SIZE_TRAIN, inp.MIN_SIZE_TRAIN_SAMPLING)
        crop = None
        if inp.CROP.ENABLED:
            crop = [
                *flip,
                T.ResizeShortestEdge(inp.CROP.RESIZE_SHORTEST_EDGE, sample_style="choice"),
                T.RandomCrop(inp.CROP.TYPE, inp.CROP.SIZE),
                resize,
            ]
        return {
            "is_train": True,
            "augmentations": [*flip, resize],
            "crop_augmentations": crop,
            "crop_prob": inp.CROP.PROB,
            "image_format": inp.FORMAT,
        }

    def __call__(self, dataset_dict: dict) -> dict:
        """A copy with ``image`` ``uint8[3, H, W]``, for training with ``instances`` (absolute x0, y0, x1, y1)."""
        dataset_dict = copy.deepcopy(dataset_dict)  # the dataset's own dict must stay unchanged
        image = utils.read_image(dataset_dict["file_name"], format=self.image_format)
        utils.check_image_size(dataset_dict, image)
        augmentations = self.augmentations
        if self.is_train and self.crop_augmentations is not None and np.random.rand() < self.crop_prob:
            augmentations = self.crop_augmentations
        aug_input = T.AugInput(image)
        transforms = augmentations(aug_input)
        image = aug_input.image
        image_shape = image.shape[:2]
        dataset_dict["image"] = torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1)))
        annotations = dataset_dict.pop("annotations", None)
        if not self.is_train or annotations is None:
            return dataset_dict
        annotations = [
            utils.transform_instance_annotations(
                {k: v for k, v in obj.items() if k not in ("segmentation", "keypoints")}, transforms, image_shape
            )
            for obj in annotations
            if obj.get("iscrowd", 0) == 0
        ]
        instances = utils.annotations_to_instances(annotations, image_shape)
        dataset_dict["instances"] = utils.filter_empty_instances(instances)
        return dataset_dict
