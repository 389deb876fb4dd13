"""Whether a model's boxes follow the image size: the size of its boxes against the true ones, per test size.

A DETR predicts boxes in coordinates normalised by the image, so a model that
cannot tell how large the image is in pixels (objects smaller than a token,
positions normalised by the image) predicts an object's size in image units
as if every image had the size it saw most: resized larger its boxes come out
too large, resized smaller too small, and AP75 falls faster than AP50.

For each ``--scales`` factor (as ``detr-peg eval --scales``: the validation
short side and long-side cap times the factor, checked the same way before anything runs) the first ``--count`` images of
the annotation file are detected one image at a time (``Detector.predict``,
boxes in the original image's pixels, ``x0, y0, x1, y1``), each detection
scoring at least ``--threshold`` is matched to the ground-truth box of its
image it overlaps most (kept when that IoU is at least ``--min-iou``), and
the median ratio of its width and height to that box's is reported: 1 when
the boxes keep the objects' size, above 1 when they are too large.

Prints one JSON object; ``--output FILE`` writes it too. Bad input (an
option out of range, no such checkpoint, annotation file or image) is one
line on stderr and exit status 2.

    python tools/box_scale.py --checkpoint RUN/checkpoint.pth --annotations outputs/proxy_data/data/annotations_val.json \\
        --images outputs/proxy_data/data/val --scales 0.6667,1,1.3333
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
from torchvision.ops import box_convert, box_iou  # noqa: E402

from detr_peg.cli import option_types  # noqa: E402
from detr_peg.cli.json_report import run_json_report  # noqa: E402
from detr_peg.cli.main import OneLineParser  # noqa: E402
from detr_peg.data.coco_file import read_coco_file  # noqa: E402
from detr_peg.detector import Detector  # noqa: E402
from detr_peg.engine.evaluation.scales import check_scales, scaled_data  # noqa: E402


def ground_truth(annotation_file: Path, images: Path, count: int) -> list[tuple[Path, torch.Tensor]]:
    """The first ``count`` images of a COCO annotation file (or YOLO data.yaml), each with its boxes ``float32[N, 4]`` (x0, y0, x1, y1,
    pixels; crowd boxes left out). DataError when the file is not a valid COCO file
    (:func:`~detr_peg.data.coco_file.read_coco_file`: an image missing from ``images`` too)."""
    data = read_coco_file(annotation_file, images_dir=images).data  # images_dir: a YOLO data.yaml's split
    boxes: dict[int, list[list[float]]] = {}
    for ann in data["annotations"]:
        if not ann.get("iscrowd", 0):
            boxes.setdefault(ann["image_id"], []).append(ann["bbox"])
    out = []
    for image in data["images"][:count]:
        path = images / image["file_name"]
        xywh = torch.tensor(boxes.get(image["id"], []), dtype=torch.float32).reshape(-1, 4)
        out.append((path, box_convert(xywh, "xywh", "xyxy")))
    return out


def box_scale(
    detector: Detector, samples: list[tuple[Path, torch.Tensor]], *, threshold: float, min_iou: float
) -> dict:
    """The median width and height ratio of matched detections to their ground truth (see the module docstring).

    Returns:
        ``{"matched", "detections", "width_ratio", "height_ratio"}``; the ratios are None when nothing matched.
    """
    results = detector.predict([path for path, _ in samples], threshold=threshold)
    widths: list[float] = []
    heights: list[float] = []
    detections = 0
    for (_, truth), found in zip(samples, results):
        boxes = torch.as_tensor(found.boxes, dtype=torch.float32).reshape(-1, 4)
        detections += len(boxes)
        if not len(boxes) or not len(truth):
            continue
        best, index = box_iou(boxes, truth).max(dim=1)
        for box, iou, j in zip(boxes, best.tolist(), index.tolist()):
            if iou >= min_iou:
                widths.append(float((box[2] - box[0]) / (truth[j, 2] - truth[j, 0])))
                heights.append(float((box[3] - box[1]) / (truth[j, 3] - truth[j, 1])))
    return {
        "matched": len(widths),
        "detections": detections,
        "width_ratio": statistics.median(widths) if widths else None,
        "height_ratio": statistics.median(heights) if heights else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="box_scale.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True, metavar="FILE", help="a detr-peg checkpoint")
    parser.add_argument("--annotations", required=True, type=Path, metavar="FILE", help="a COCO annotation file")
    parser.add_argument("--images", required=True, type=Path, metavar="DIR", help="the folder of its images")
    parser.add_argument("--scales", type=option_types.scale_list, default=[1.0], metavar="S1,S2",
                        help="test scales (default 1)")  # fmt: skip
    parser.add_argument("--count", type=option_types.integer(1), default=200, metavar="N",
                        help="images to use (default 200)")  # fmt: skip
    parser.add_argument("--threshold", type=option_types.number(0.0, 1.0), default=0.3, metavar="P",
                        help="score (default 0.3)")  # fmt: skip
    parser.add_argument("--min-iou", type=option_types.number(0.0, 1.0), default=0.1, metavar="IOU",
                        help="match (default 0.1)")  # fmt: skip
    parser.add_argument("--output", type=Path, metavar="FILE", help="also write the JSON object here")
    args = parser.parse_args(argv)
    return run_json_report("box_scale.py", lambda: report(args), args.output)


def report(args: argparse.Namespace) -> dict:
    """The JSON report of the command line ``args``: every scale checked before any detection, as detr-peg eval."""
    samples = ground_truth(args.annotations, args.images, args.count)
    loaded = Detector.from_checkpoint(args.checkpoint, device="cpu").loaded  # read once, resized per scale
    data = loaded.config.data
    check_scales(data, args.scales, ())
    rows = []
    for scale in args.scales:
        size = scaled_data(data, scale)
        config = dataclasses.replace(loaded.config, data=size)
        detector = Detector(dataclasses.replace(loaded, config=config), device="cpu")
        found = box_scale(detector, samples, threshold=args.threshold, min_iou=args.min_iou)
        rows.append({"scale": scale, "short_side": size.val_scale, **found})
    return {
        "checkpoint": str(args.checkpoint),
        "annotations": str(args.annotations),
        "images": len(samples),
        "threshold": args.threshold,
        "min_iou": args.min_iou,
        "results": rows,
    }


if __name__ == "__main__":
    sys.exit(main())
