"""A detection dataset over a COCO annotation file and an image folder; the file is validated at construction.

``dataset.coco`` (evaluation ground truth) keeps crowd regions; training targets leave them out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from detr_peg.config.schema import DataConfig
from detr_peg.data.coco_file import OnBadSample, read_coco_file
from detr_peg.data.image_input import load_rgb_image
from detr_peg.data.label_map import LabelMap
from detr_peg.data.transforms import build_eval_transforms, build_train_transforms
from detr_peg.errors import ConfigError, DataError
from detr_peg.messages import listed
from detr_peg.outputs import path_obstacle

logger = logging.getLogger(__name__)

#: In ``skip`` mode, give up after this many unreadable images in a row.
MAX_CONSECUTIVE_SKIPS = 64

Transforms = Callable[[Any, dict[str, Any]], tuple[Any, dict[str, Any]]]


#: The EXIF tag of a photo's orientation; values 5-8 swap its width and height when shown.
ORIENTATION_TAG = 0x0112


class CocoDetection(Dataset):
    """COCO-format detection data: ``dataset[i] -> (image, target)`` for image ``ids[i]`` (ids ascending).

    With :mod:`detr_peg.data.transforms`: ``image`` float32 ``[3, H, W]`` ImageNet-normalised; ``boxes`` float32
    ``[N, 4]`` normalised cxcywh of the unpadded image; ``labels`` int64 ``[N]``; ``image_id``; ``orig_size``/``size``
    int64 ``(h, w)`` of the stored/returned image. Untransformed: uint8 ``Image``, pixel XYXY ``BoundingBoxes``.
    Crowd boxes are left out, others clamped, empty ones dropped; a given ``label_map`` must hold every used category.
    A bad image (undecodable, or sized unlike the file says) raises ``DataError``; with ``on_bad_sample="skip"``
    the next readable index is returned and ``num_skipped`` (per process) counts it.
    """

    def __init__(
        self,
        *,
        images_dir: str | Path,
        annotation_file: str | Path,
        transforms: Transforms | None = None,
        contiguous_labels: bool = True,
        label_map: LabelMap | None = None,
        on_bad_sample: OnBadSample = "error",
    ):
        super().__init__()
        if on_bad_sample not in ("error", "skip"):
            raise ConfigError(f"data.on_bad_sample is {on_bad_sample!r}; valid values are 'error' and 'skip'.")
        self.images_dir = Path(images_dir)
        if not self.images_dir.is_dir():
            raise DataError(f"Image folder {self.images_dir} does not exist or is not a folder.")
        coco_file = read_coco_file(annotation_file, on_bad_sample=on_bad_sample, images_dir=self.images_dir)
        self.annotation_file = coco_file.path
        self.coco = coco_file.coco
        self.num_invalid_skipped, self.left_out_ids = len(coco_file.problems), coco_file.left_out
        if label_map is None:
            label_map = LabelMap.from_coco_categories(coco_file.data["categories"], contiguous=contiguous_labels)
        else:
            self._check_label_map(label_map)
        self.label_map = label_map
        self.transforms = transforms
        self.on_bad_sample = on_bad_sample
        self.ids: list[int] = sorted(self.coco.imgs)
        self.num_boxes_outside = count_boxes_outside(self.coco.dataset)
        self.num_skipped = 0
        self._bad_indices: set[int] = set()

    def _check_label_map(self, label_map: LabelMap) -> None:
        for ann in self.coco.dataset["annotations"]:
            if not label_map.has_category(ann["category_id"]):
                raise DataError(
                    f"Annotation file {self.annotation_file} has annotation id {ann['id']} with category_id "
                    f"{ann['category_id']}, which the given label map (categories {label_map.category_ids}) lacks."
                )
        named = dict(zip(label_map.category_ids, label_map.names))
        cats = self.coco.dataset["categories"]
        if differ := [f"id {c['id']} {c['name']!r} (the model's {named[c['id']]!r})" for c in cats
                      if named.get(c["id"], c["name"]) != c["name"]]:  # fmt: skip
            logger.warning("%s names categories otherwise than the model: %s; results are matched by id, so check "
                           "that the ids mean the same classes.", self.annotation_file, listed(differ))  # fmt: skip

    def __len__(self) -> int:
        return len(self.ids)

    def image_path(self, index: int) -> Path:
        """The image file of sample ``index``."""
        return self.images_dir / self.coco.imgs[self.ids[index]]["file_name"]

    def load_target(self, image_id: int, height: int, width: int) -> dict[str, Any]:
        """Untransformed target: ``boxes`` (pixel XYXY ``BoundingBoxes``), ``labels``, ``image_id``, ``orig_size``."""
        anns = [a for a in self.coco.imgToAnns.get(image_id, []) if not a.get("iscrowd", 0)]
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float64).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]
        boxes[:, 0::2].clamp_(min=0, max=width)
        boxes[:, 1::2].clamp_(min=0, max=height)
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        labels = torch.tensor([self.label_map.label_of(a["category_id"]) for a in anns], dtype=torch.int64)
        return {
            "boxes": tv_tensors.BoundingBoxes(
                boxes[keep].float(), format=tv_tensors.BoundingBoxFormat.XYXY, canvas_size=(height, width)
            ),
            "labels": labels[keep],
            "image_id": int(image_id),
            "orig_size": torch.tensor([height, width], dtype=torch.int64),
        }

    def _load(self, index: int) -> tuple[Any, dict[str, Any]]:
        image_id = self.ids[index]
        info = self.coco.imgs[image_id]
        path = self.images_dir / info["file_name"]
        pil_image = load_rgb_image(path)
        width, height = pil_image.size
        expected = (info.get("height", height), info.get("width", width))
        if expected != (height, width):
            turned = expected == (width, height) and pil_image.getexif().get(ORIENTATION_TAG, 1) in (5, 6, 7, 8)
            raise DataError(
                f"Image file {path} is {height}x{width} (height x width) but {self.annotation_file} says "
                f"{expected[0]}x{expected[1]} for image id {image_id}; "
                + ("its EXIF orientation turns it, which detr_peg does not apply: rotate the file's pixels."
                   if turned else "fix the annotation or the image.")
            )  # fmt: skip
        image = tv_tensors.Image(F.pil_to_tensor(pil_image))
        target = self.load_target(image_id, height, width)
        if self.transforms is not None:
            image, target = self.transforms(image, target)
        target["size"] = torch.tensor(list(image.shape[-2:]), dtype=torch.int64)
        return image, target

    def __getitem__(self, index: int) -> tuple[Tensor, dict[str, Any]]:
        """Sample ``index``; ``DataError`` if unusable (``error``) or ``MAX_CONSECUTIVE_SKIPS`` in a row are (``skip``)."""
        if self.on_bad_sample == "error":
            return self._load(index)
        n = len(self)
        index %= n
        tries = min(n, MAX_CONSECUTIVE_SKIPS)
        for step in range(tries):
            i = (index + step) % n
            if i in self._bad_indices:
                continue
            try:
                return self._load(i)
            except DataError as err:
                self._bad_indices.add(i)
                self.num_skipped += 1
                logger.warning("Skipping sample %d (%d skipped so far): %s", i, self.num_skipped, err)
        raise DataError(
            f"None of the {tries} images from index {index} of {self.annotation_file} could be read; "
            "check the image folder (the warnings above name each file)."
        )


def count_boxes_outside(data: dict[str, Any]) -> int:
    """Non-crowd annotations whose box has no area inside its image (images without a size are not counted)."""
    sizes = {img["id"]: (img.get("width"), img.get("height")) for img in data["images"]}
    count = 0
    for ann in data["annotations"]:
        width, height = sizes.get(ann["image_id"], (None, None))
        if ann.get("iscrowd", 0) or width is None or height is None:
            continue
        x, y, w, h = ann["bbox"]
        if min(x + w, width) <= max(x, 0) or min(y + h, height) <= max(y, 0):
            count += 1
    return count


def build_coco_dataset(
    cfg: DataConfig, split: Literal["train", "val"], *, label_map: LabelMap | None = None
) -> CocoDetection:
    """The ``train`` or ``val`` dataset of ``cfg`` with that split's transforms (and ``label_map`` if given).

    Raises ``ConfigError`` for an unknown split or unset paths, ``DataError`` as :class:`CocoDetection`.
    """
    if split not in ("train", "val"):
        raise ConfigError(f"Unknown dataset split {split!r}; valid splits are 'train' and 'val'.")
    images = getattr(cfg, f"{split}_images")
    annotations = getattr(cfg, f"{split}_annotations")
    for key, value in ((f"{split}_images", images), (f"{split}_annotations", annotations)):
        if not value:
            raise ConfigError(f"data.{key} is not set; give the path of the {split} {key.split('_')[1]}.")
        try:
            os.lstat(value)
        except FileNotFoundError:  # nothing there: name the key (its value may come from a config file)
            cwd = "" if os.path.isabs(value) else f"a relative path is read from the current folder, {os.getcwd()}"
            why = path_obstacle(value) or cwd
            raise DataError(f"data.{key} {value} does not exist{f' ({why})' if why else ''}.") from None
        except OSError:
            pass  # the reader says what is wrong (a name too long, no permission)
    transforms = build_train_transforms(cfg) if split == "train" else build_eval_transforms(cfg)
    return CocoDetection(
        images_dir=images,
        annotation_file=annotations,
        transforms=transforms,
        contiguous_labels=cfg.contiguous_labels,
        label_map=label_map,
        on_bad_sample=cfg.on_bad_sample,
    )
