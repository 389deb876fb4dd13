"""Write the copy-paste composite proxy (real COCO objects on real backgrounds) and print its statistics.

Objects are cut with their masks from a COCO-format source and pasted onto crops of other images of the same
split (``train``, ``tune``, ``val``, ``test``, each from its own source images); one category ``object``; boxes
COCO ``[x, y, w, h]`` pixels of the visible part; deterministic in ``--seed``. The statistics (objects per image,
COCO size classes, aspect ratios, touching or overlapping objects, token grids) are also in
``OUTPUT/summary.json``.

    python tools/composite_data.py --source ../shared/data/coco128 --output outputs/composite
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from pycocotools.coco import COCO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from detr_peg.outputs import atomic_write_text  # noqa: E402

SPLITS = ("train", "tune", "val", "test")
_SPLIT_CODES = {name: i for i, name in enumerate(SPLITS)}


@dataclass(frozen=True)
class CompositeOptions:
    """Square image ``size`` (px), ``counts`` per split, objects per image and their side range, ``min_visible``."""

    size: int = 320
    counts: tuple[int, int, int, int] = (2000, 300, 500, 500)
    objects: tuple[int, int] = (3, 8)
    object_sides: tuple[int, int] = (24, 288)
    min_visible: float = 0.3
    tune_fraction: float = 0.2
    seed: int = 0


@dataclass
class _Cutout:
    image_id: int
    annotation_id: int
    pixels: np.ndarray  # uint8[h, w, 3], the object's box
    mask: np.ndarray  # bool[h, w]


def source_splits(train_file: Path, val_file: Path, tune_fraction: float) -> dict[str, tuple[Path, list[int]]]:
    """Source file and image ids per split (``tune``: last ``tune_fraction`` of train; val / test: halves of val)."""
    train_ids = sorted(img["id"] for img in json.loads(Path(train_file).read_text())["images"])
    val_ids = sorted(img["id"] for img in json.loads(Path(val_file).read_text())["images"])
    cut = len(train_ids) - max(1, round(len(train_ids) * tune_fraction))
    half = len(val_ids) // 2
    return {
        "train": (Path(train_file), train_ids[:cut]),
        "tune": (Path(train_file), train_ids[cut:]),
        "val": (Path(val_file), val_ids[:half]),
        "test": (Path(val_file), val_ids[half:]),
    }


def _cutouts(coco: COCO, images: Path, image_ids: Sequence[int]) -> tuple[list[_Cutout], list[np.ndarray]]:
    """The split's objects (non-crowd, at least 12 px a side and 150 px of mask) and its background images."""
    cutouts, backgrounds = [], []
    for image_id in image_ids:
        info = coco.imgs[image_id]
        pixels = np.asarray(Image.open(images / info["file_name"]).convert("RGB"))
        boxes = []
        for ann in coco.imgToAnns[image_id]:
            x, y, w, h = ann["bbox"]
            boxes.append((x, y, w, h))
            if ann.get("iscrowd") or w < 12 or h < 12:
                continue
            mask = coco.annToMask(ann).astype(bool)
            x0, y0 = int(math.floor(x)), int(math.floor(y))
            x1, y1 = int(math.ceil(x + w)), int(math.ceil(y + h))
            crop = mask[y0:y1, x0:x1]
            if crop.sum() >= 150:
                cutouts.append(_Cutout(image_id, ann["id"], pixels[y0:y1, x0:x1].copy(), crop.copy()))
        backgrounds.append((image_id, pixels, boxes))
    return cutouts, backgrounds


def _background(rng: np.random.Generator, source: tuple[int, np.ndarray, list], size: int) -> np.ndarray:
    """A square crop of ``source`` (of 20 tried, the one its annotated boxes cover least), resized to ``size``."""
    _, pixels, boxes = source
    height, width = pixels.shape[:2]
    best, best_cover = None, math.inf
    for _ in range(20):
        side = int(min(height, width) * rng.uniform(0.4, 1.0))
        x0, y0 = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
        cover = sum(
            max(0.0, min(x + w, x0 + side) - max(x, x0)) * max(0.0, min(y + h, y0 + side) - max(y, y0))
            for x, y, w, h in boxes
        )
        if cover < best_cover:
            best, best_cover = (x0, y0, side), cover
    x0, y0, side = best
    crop = Image.fromarray(pixels[y0 : y0 + side, x0 : x0 + side])
    return np.asarray(crop.resize((size, size), Image.BILINEAR)).copy()


def _paste(rng: np.random.Generator, canvas: np.ndarray, cutout: _Cutout, options: CompositeOptions):
    """Paste ``cutout`` rescaled (longer side log-uniform in ``object_sides``) at a random place; its mask."""
    h, w = cutout.mask.shape
    low, high = options.object_sides
    longer = math.exp(rng.uniform(math.log(low), math.log(min(high, options.size))))
    scale = longer / max(h, w)
    nh, nw = max(2, round(h * scale)), max(2, round(w * scale))
    pixels = Image.fromarray(cutout.pixels).resize((nw, nh), Image.BILINEAR)
    mask = Image.fromarray(cutout.mask.astype(np.uint8) * 255).resize((nw, nh), Image.BILINEAR)
    pixels, mask = np.asarray(pixels), np.asarray(mask) >= 128
    if rng.random() < 0.5:
        pixels, mask = pixels[:, ::-1], mask[:, ::-1]
    y0, x0 = int(rng.integers(0, options.size - nh + 1)), int(rng.integers(0, options.size - nw + 1))
    full = np.zeros((options.size, options.size), dtype=bool)
    full[y0 : y0 + nh, x0 : x0 + nw] = mask
    region = canvas[y0 : y0 + nh, x0 : x0 + nw]
    region[mask] = pixels[mask]
    return full


def compose(rng: np.random.Generator, cutouts, backgrounds, options: CompositeOptions):
    """One image: ``(uint8[size, size, 3], background source image id, [(source annotation id, mask)])``."""
    background = backgrounds[int(rng.integers(len(backgrounds)))]
    canvas = _background(rng, background, options.size)
    placed: list[tuple[int, np.ndarray, int]] = []
    for _ in range(int(rng.integers(options.objects[0], options.objects[1] + 1))):
        cutout = cutouts[int(rng.integers(len(cutouts)))]
        mask = _paste(rng, canvas, cutout, options)
        placed = [(ann, visible & ~mask, pasted) for ann, visible, pasted in placed]  # the new one covers them
        placed.append((cutout.annotation_id, mask, int(mask.sum())))
    kept = [(ann, visible) for ann, visible, pasted in placed if visible.sum() >= options.min_visible * pasted]
    return canvas, background[0], kept


def _annotation(image_id: int, ann_id: int, source_ann: int, visible: np.ndarray) -> dict:
    ys, xs = np.nonzero(visible)
    x0, y0, x1, y1 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
    return {
        "id": ann_id, "image_id": image_id, "category_id": 1, "iscrowd": 0,
        "bbox": [x0, y0, x1 - x0, y1 - y0], "area": int(visible.sum()), "source_annotation": source_ann,
    }  # fmt: skip


def generate_composites(source: Path, out: Path, options: CompositeOptions = CompositeOptions()) -> dict:
    """Write ``<split>/*.jpg``, ``annotations_<split>.json`` and ``summary.json`` into ``out``; the summary."""
    source, out = Path(source), Path(out)
    splits = source_splits(source / "annotations_train.json", source / "annotations_val.json", options.tune_fraction)
    summary: dict = {"options": asdict(options), "source": str(source), "splits": {}}
    for split, count in zip(SPLITS, options.counts):
        annotation_file, image_ids = splits[split]
        if not count:
            continue
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints while indexing
            coco = COCO(str(annotation_file))
        cutouts, backgrounds = _cutouts(coco, source / "images", image_ids)
        (out / split).mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for index in range(count):
            rng = np.random.default_rng([options.seed, _SPLIT_CODES[split], index])
            pixels, background, objects = compose(rng, cutouts, backgrounds, options)
            name = f"{index:06d}.jpg"
            Image.fromarray(pixels).save(out / split / name, quality=92)
            images.append({"id": index + 1, "file_name": name, "width": options.size, "height": options.size,
                           "source_background": background})  # fmt: skip
            for source_ann, visible in objects:
                annotations.append(_annotation(index + 1, len(annotations) + 1, source_ann, visible))
        data = {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "object"}]}
        atomic_write_text(out / f"annotations_{split}.json", json.dumps(data))
        summary["splits"][split] = {
            "source_images": list(image_ids),
            "source_annotations": sorted({c.annotation_id for c in cutouts}),
            **object_statistics(annotations, len(images), options.size),
        }
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1))
    return summary


def object_statistics(annotations: Sequence[dict], images: int, size: int) -> dict:
    """Objects per image, COCO size classes, aspect ratios, and how many touch or overlap another's box."""
    sides = np.array([math.sqrt(a["area"]) for a in annotations])
    ratios = np.array([a["bbox"][2] / a["bbox"][3] for a in annotations])
    by_image: dict[int, list] = {}
    for a in annotations:
        by_image.setdefault(a["image_id"], []).append(a["bbox"])
    overlapping = sum(
        any(_touch(box, other) for other in boxes if other is not box) for boxes in by_image.values() for box in boxes
    )
    return {
        "images": images,
        "objects": len(annotations),
        "objects_per_image": round(len(annotations) / max(images, 1), 2),
        "small_medium_large": [
            int((sides < 32).sum()),
            int(((sides >= 32) & (sides < 96)).sum()),
            int((sides >= 96).sum()),
        ],  # fmt: skip
        "aspect_ratio_quantiles": [round(float(q), 2) for q in np.quantile(ratios, [0.05, 0.25, 0.5, 0.75, 0.95])],
        "touching_or_overlapping": round(overlapping / max(len(annotations), 1), 3),
        "token_grid_stride16": [math.ceil(size / 16)] * 2,
        "token_grid_stride32": [math.ceil(size / 32)] * 2,
    }


def _touch(a: Sequence[float], b: Sequence[float]) -> bool:
    return a[0] <= b[0] + b[2] and b[0] <= a[0] + a[2] and a[1] <= b[1] + b[3] and b[1] <= a[1] + a[3]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, required=True,
                        help="a folder with images/, annotations_train.json and annotations_val.json")  # fmt: skip
    parser.add_argument("--output", type=Path, required=True, help="the folder to write")
    parser.add_argument("--size", type=int, default=CompositeOptions.size, help="image side in pixels (320)")
    parser.add_argument("--counts", default=",".join(map(str, CompositeOptions.counts)),
                        help=f"images per split ({', '.join(SPLITS)}), comma-separated")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    missing = [
        n for n in ("images", "annotations_train.json", "annotations_val.json") if not (args.source / n).exists()
    ]
    if missing:
        print(f"composite_data: error: --source {args.source} has no {', '.join(missing)}.", file=sys.stderr)
        return 2
    try:
        counts = tuple(int(c) for c in args.counts.split(","))
    except ValueError:
        counts = ()
    if len(counts) != len(SPLITS) or min(counts) < 0 or args.size < 32:
        print(f"composite_data: error: --counts {args.counts} must be {len(SPLITS)} counts >= 0 and --size "
              f"{args.size} at least 32.", file=sys.stderr)  # fmt: skip
        return 2
    options = CompositeOptions(size=args.size, counts=counts, seed=args.seed)
    summary = generate_composites(args.source, args.output, options)
    for split, stats in summary["splits"].items():
        shown = {k: v for k, v in stats.items() if not k.startswith("source_")}
        print(f"{split}: {len(stats['source_images'])} source images; {json.dumps(shown)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
