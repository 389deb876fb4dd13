"""The detections of one image, as :class:`detr_peg.Detector` returns them."""

from __future__ import annotations

import colorsys
import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torchvision.ops import clip_boxes_to_image
from torchvision.transforms.v2 import functional as F
from torchvision.utils import draw_bounding_boxes

from detr_peg.config.ranges import is_whole
from detr_peg.data.image_input import ImageInput, as_rgb_tensor
from detr_peg.data.label_map import LabelMap
from detr_peg.errors import DataError
from detr_peg.messages import install_hint


@dataclass(repr=False)
class Detections:
    """Detections of one image, highest score first.

    Attributes:
        boxes: ``Tensor[N, 4]`` float32, absolute (x0, y0, x1, y1) pixels of the original image.
        scores: ``Tensor[N]`` float32 in [0, 1].
        labels: ``Tensor[N]`` int64, the model's class indices.
        category_ids: the dataset category id of each detection.
        class_names: the category name of each detection.
        image_size: ``(height, width)`` of the original image in pixels.
        source: the file the image was read from, if it came from one.
    """

    boxes: Tensor
    scores: Tensor
    labels: Tensor
    category_ids: list[int]
    class_names: list[str]
    image_size: tuple[int, int]
    source: str | None = field(default=None)

    @classmethod
    def from_postprocessed(
        cls,
        detection: dict[str, Tensor],
        *,
        threshold: float,
        label_map: LabelMap | None,
        image_size: tuple[int, int],
        source: str | None = None,
    ) -> Detections:
        """Detections scoring at least ``threshold``, best first, on the CPU, boxes clipped to ``image_size`` (h, w).

        COCO evaluation scores the unclipped boxes, as the official code does.
        """
        keep = (detection["scores"].double() >= threshold).cpu()  # in float32, a threshold just above a score kept it
        if label_map is not None:  # a label that is no category (data.contiguous_labels=false) is dropped, as COCO's is
            ids = label_map.category_ids
            known = set(range(len(ids))) if label_map.contiguous else set(ids)
            keep &= torch.tensor([label in known for label in detection["labels"].tolist()], dtype=bool)
        scores = detection["scores"].cpu()[keep].float()
        order = scores.argsort(descending=True, stable=True)
        scores = scores[order]
        labels = detection["labels"].cpu()[keep][order]
        boxes = clip_boxes_to_image(detection["boxes"].cpu()[keep].float()[order], image_size)
        names = [category_of(label_map, int(label)) for label in labels.tolist()]
        return cls(
            boxes=boxes,
            scores=scores,
            labels=labels,
            category_ids=[c for c, _ in names],
            class_names=[n for _, n in names],
            image_size=image_size,
            source=source,
        )

    def __len__(self) -> int:
        return int(self.scores.numel())

    def __getitem__(self, index: Any) -> Detections:
        """The detections at ``index`` (a position, a slice, positions, or a bool mask such as
        ``d.scores > 0.5``), in that order, as Detections of the same image."""
        wrong = TypeError(f"Detections are indexed by a position, a slice, positions or a bool mask, got {index!r}.")
        if isinstance(index, (Tensor, np.ndarray)) and index.ndim == 0:
            index = index.item()  # d[d.scores.argmax()]: a position
        if is_whole(index) or isinstance(index, slice):  # Python's rules: negative positions and steps too
            picked = range(len(self))[index]  # IndexError beyond the last
            rows = torch.tensor([picked] if isinstance(picked, int) else list(picked), dtype=torch.long)
        else:
            try:
                index = torch.as_tensor(index)
                index = index.long() if index.numel() == 0 else index  # [] is no positions, not a float tensor
            except (TypeError, ValueError, RuntimeError):
                raise wrong from None
            if index.dim() != 1 or index.is_floating_point() or index.is_complex():
                raise wrong
            rows = torch.arange(len(self))[index].reshape(-1)  # IndexError beyond the last
        picked = rows.tolist()
        return Detections(
            self.boxes[rows], self.scores[rows], self.labels[rows], [self.category_ids[i] for i in picked],
            [self.class_names[i] for i in picked], self.image_size, self.source,
        )  # fmt: skip

    def __repr__(self) -> str:
        h, w = self.image_size
        lines = [f"Detections({len(self)} in a {w} x {h} image{f' ({self.source})' if self.source else ''})"]
        for box, name, score in zip(self.boxes.tolist()[:10], self.class_names, self.scores.tolist()):
            lines.append(f"  {name:<16} {score:.3f}  [{', '.join(f'{v:.1f}' for v in box)}]")
        if len(self) > 10:
            lines.append(f"  ... {len(self) - 10} more")
        return "\n".join(lines)

    def records(self, image_id: int) -> list[dict[str, Any]]:
        """COCO-style result records of this image (what ``detr-peg predict`` writes).

        Each is ``{"image_id", "file_name", "category_id", "category_name",
        "bbox": [x, y, w, h], "score"}`` in pixels, rounded to 0.01 px and 5 digits.
        """
        if not is_whole(image_id):
            raise TypeError(f"image_id must be an integer (COCO's image ids are), got {image_id!r}")
        out = []
        for box, category_id, name, score in zip(
            self.boxes.tolist(), self.category_ids, self.class_names, self.scores.tolist()
        ):
            x0, y0, x1, y1 = box
            out.append(
                {
                    "image_id": int(image_id),
                    "file_name": self.source,
                    "category_id": category_id,
                    "category_name": name,
                    "bbox": [round(v, 2) for v in (x0, y0, x1 - x0, y1 - y0)],
                    "score": round(float(score), 5),
                }
            )
        return out

    def draw(self, picture: ImageInput, width: int | None = None, *, channels: str = "RGB") -> Image.Image:
        """The picture (any input ``Detector.predict`` takes, with its ``channels``, as predicted on) with each box,
        class name and score in a colour per category; line ``width`` defaults to the longer side / 320. A picture
        of another size than :attr:`image_size` is a ``DataError``: the boxes are in that image's pixels."""
        pixels = as_rgb_tensor(picture, "picture", channels=channels)  # DataError if unusable, as in predict
        if tuple(pixels.shape[-2:]) != tuple(self.image_size):
            (h, w), (ph, pw) = self.image_size, pixels.shape[-2:]
            raise DataError(f"picture is {pw} x {ph} pixels but the detections are of a {w} x {h} image; draw them "
                            "on the image they were predicted on.")  # fmt: skip
        if width is None:
            width = min(max(2, round(max(pixels.shape[-2:]) / 320)), max(pixels.shape[-2:]))  # 1 on a 1 x 1 image
        if not (is_whole(width) and 1 <= width <= max(pixels.shape[-2:])):  # a huge width draws for minutes
            raise ValueError(
                f"width must be a whole number of pixels from 1 to {max(pixels.shape[-2:])}, got {width!r}."
            )
        labels = [f"{name} {score:.2f}" for name, score in zip(self.class_names, self.scores.tolist())]
        colors = [category_color(c) for c in self.category_ids]
        if len(self):
            pixels = draw_bounding_boxes(
                pixels, self.boxes, labels=labels, colors=colors, width=int(width), **_LABEL_STYLE
            )
        return F.to_pil_image(pixels)

    def to_supervision(self) -> Any:
        """The same detections as ``supervision.Detections`` (``class_id``: category ids, ``data["class_name"]``).

        Raises:
            ImportError: with the install command, when ``supervision`` is missing.
        """
        try:
            import supervision
        except ImportError as exc:
            raise ImportError(
                f"Detections.to_supervision needs the supervision package: {install_hint('supervision')}"
            ) from exc
        return supervision.Detections(
            xyxy=self.boxes.numpy().astype(np.float32).reshape(-1, 4),
            confidence=self.scores.numpy().astype(np.float32),
            class_id=np.asarray(self.category_ids, dtype=int),
            data={"class_name": np.asarray(self.class_names, dtype=object)},
        )


def category_of(label_map: LabelMap | None, label: int) -> tuple[int, str]:
    """``(category id, name)`` of a model label; ``(label, "class <label>")`` when the map does not know it."""
    if label_map is None:
        return label, f"class {label}"
    try:
        return label_map.category_id_of(label), label_map.name_of(label)
    except KeyError:
        return label, f"class {label}"


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
