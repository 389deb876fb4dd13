"""Detection on image files: scored boxes as JSON records and pictures with the boxes drawn.

Images are read with :func:`~detr_peg.data.image_file.load_rgb_image` (any
unreadable file is a :class:`~detr_peg.errors.DataError` naming it), resized
with the evaluation transform of the model's config and batched with padding.
Each detection at or above the score threshold becomes one record::

    {"image_id": int, "file_name": str, "category_id": int, "category_name": str,
     "bbox": [x, y, w, h], "score": float}

in pixels of the original image, with the category ids of the dataset the
model was trained on (the label map stored in the checkpoint; without one, the
label itself and the name ``"class <label>"``).
"""

from __future__ import annotations

import colorsys
import inspect
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor, nn
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F
from torchvision.utils import draw_bounding_boxes

from detr_peg.checkpoint.weights_check import check_outputs
from detr_peg.data.image_file import load_rgb_image
from detr_peg.data.label_map import LabelMap
from detr_peg.data.padding import pad_images
from detr_peg.data.transforms import build_eval_transforms
from detr_peg.errors import DataError
from detr_peg.fileio.bounded_read import check_regular_file

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")


@dataclass
class ImagePrediction:
    """The detections of one image.

    Attributes:
        image_id: 1-based position among the inputs.
        path: the image file.
        image: the decoded picture (RGB).
        records: the JSON records (see the module docstring).
        boxes: ``Tensor[N, 4]`` absolute ``(x0, y0, x1, y1)`` of the records.
    """

    image_id: int
    path: Path
    image: Image.Image
    records: list[dict]
    boxes: Tensor


def collect_images(inputs: Sequence[str | Path]) -> list[Path]:
    """Image files from files and folders (folders: every image file inside, recursively, sorted).

    Raises:
        DataError: an input does not exist, or a folder holds no image file.
    """
    found: list[Path] = []
    for item in inputs:
        path = Path(item)
        if os.path.isdir(path):
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise DataError(f"Folder {path} holds no image files ({', '.join(IMAGE_SUFFIXES)}).")
            found.extend(files)
        else:
            # Names a FIFO, a device, a link loop or a missing file precisely.
            check_regular_file(path, "Input", "image", DataError)
            found.append(path)
    return found


def _names(label_map: LabelMap | None, label: int) -> tuple[int, str]:
    if label_map is None:
        return label, f"class {label}"
    try:
        return label_map.category_id_of(label), label_map.name_of(label)
    except KeyError:
        return label, f"class {label}"


@torch.no_grad()
def predict_images(
    model: nn.Module,
    postprocessor: nn.Module,
    paths: Iterable[Path],
    *,
    label_map: LabelMap | None,
    score_threshold: float,
    batch_size: int = 1,
    device: torch.device | str = "cpu",
    progress=None,
) -> Iterable[ImagePrediction]:
    """Yield the detections of each image, in input order.

    Args:
        model: a detector in eval mode with its ``config`` attribute (as
            :func:`detr_peg.load_model` returns it).
        postprocessor: its post-processor.
        paths: image files.
        label_map: maps labels to category ids and names, or None.
        score_threshold: detections below it are left out.
        batch_size: images per forward pass.
        device: where the model is.
        progress: a callable advanced by one per image (a tqdm ``update``), or None.
    """
    transform = build_eval_transforms(model.config.data)
    paths = list(paths)
    for start in range(0, len(paths), batch_size):
        chunk = paths[start : start + batch_size]
        pictures = [load_rgb_image(p) for p in chunk]
        tensors = [transform(tv_tensors.Image(F.pil_to_tensor(pic))) for pic in pictures]
        images, mask = pad_images(tensors, size_divisibility=model.size_divisibility)
        outputs = model(images.to(device), mask.to(device))
        check_outputs(outputs)
        sizes = torch.tensor([[pic.height, pic.width] for pic in pictures], device=device)
        for offset, (path, pic, det) in enumerate(zip(chunk, pictures, postprocessor(outputs, sizes))):
            keep = det["scores"] >= score_threshold
            boxes = det["boxes"][keep].float().cpu()
            records = []
            for box, label, score in zip(boxes.tolist(), det["labels"][keep].tolist(), det["scores"][keep].tolist()):
                category_id, name = _names(label_map, int(label))
                x0, y0, x1, y1 = box
                records.append(
                    {
                        "image_id": start + offset + 1,
                        "file_name": str(path),
                        "category_id": category_id,
                        "category_name": name,
                        "bbox": [round(v, 2) for v in (x0, y0, x1 - x0, y1 - y0)],
                        "score": round(float(score), 5),
                    }
                )
            if progress is not None:
                progress(1)
            yield ImagePrediction(start + offset + 1, path, pic, records, boxes)


def _color(category_id: int) -> tuple[int, int, int]:
    """A stable, well-separated colour per category (golden-ratio hues)."""
    hue = (category_id * 0.618033988749895) % 1.0
    r, g, b = colorsys.hsv_to_rgb(hue, 0.85, 0.95)
    return int(r * 255), int(g * 255), int(b * 255)


#: Label text on a filled box of the box's colour, where torchvision supports it (>= 0.23).
_LABEL_STYLE = (
    {"fill_labels": True, "label_colors": "white"}
    if "fill_labels" in inspect.signature(draw_bounding_boxes).parameters
    else {}
)


def draw_prediction(prediction: ImagePrediction, width: int | None = None) -> Image.Image:
    """The picture with each record's box, category name and score drawn.

    Args:
        prediction: one image's detections.
        width: line width in pixels (default: about 1/320 of the longer side, at least 2).
    """
    if not prediction.records:
        return prediction.image.copy()
    pixels = F.pil_to_tensor(prediction.image)
    if width is None:
        width = max(2, round(max(prediction.image.size) / 320))
    labels = [f"{r['category_name']} {r['score']:.2f}" for r in prediction.records]
    colors = [_color(r["category_id"]) for r in prediction.records]
    drawn = draw_bounding_boxes(pixels, prediction.boxes, labels=labels, colors=colors, width=width, **_LABEL_STYLE)
    return F.to_pil_image(drawn)


def unique_png_name(path: Path, used: set[str]) -> str:
    """``<stem>.png``, or ``<stem>_2.png``, ... when an earlier input had the same stem."""
    name, n = f"{path.stem}.png", 1
    while name in used:
        n += 1
        name = f"{path.stem}_{n}.png"
    used.add(name)
    return name
