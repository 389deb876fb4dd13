"""Pictures of detections: each box drawn with its category name and score."""

from __future__ import annotations

import colorsys
import inspect

from PIL import Image
from torchvision.transforms.v2 import functional as F
from torchvision.utils import draw_bounding_boxes

from detr_peg.engine.detections import Detections


def category_color(category_id: int) -> tuple[int, int, int]:
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


def draw_detections(picture: Image.Image, detections: Detections, width: int | None = None) -> Image.Image:
    """``picture`` (RGB, original size) with each box, name and score; ``width`` defaults to the longer side / 320."""
    picture = picture if picture.mode == "RGB" else picture.convert("RGB")
    if len(detections) == 0:
        return picture.copy()
    if width is None:
        width = max(2, round(max(picture.size) / 320))
    labels = [f"{name} {score:.2f}" for name, score in zip(detections.class_names, detections.scores.tolist())]
    colors = [category_color(c) for c in detections.category_ids]
    pixels = F.pil_to_tensor(picture)
    drawn = draw_bounding_boxes(pixels, detections.boxes, labels=labels, colors=colors, width=width, **_LABEL_STYLE)
    return F.to_pil_image(drawn)
