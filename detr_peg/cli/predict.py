"""Detect objects in images; write predictions.json and one PNG per image with the boxes drawn.

Inputs are image files and/or folders (every image inside, recursively).
predictions.json is a list of COCO-style results with the file name added:
{"image_id", "file_name", "category_id", "category_name", "bbox": [x, y, w, h],
"score"}, in pixels of the original image, for detections scoring at least
--score-threshold (default: eval.score_threshold of the checkpoint's config).
Category ids and names come from the dataset the model was trained on.
The pictures are written into a temporary folder inside the output folder
and moved into place with predictions.json only once every image is done, so
a run that fails (an unreadable image, a full disk) leaves the files of an
earlier run as they were.

Examples:
  detr-peg predict --checkpoint runs/peg/checkpoint.pth photos/ --output predictions
  detr-peg predict --checkpoint runs/peg/checkpoint.pth a.jpg b.jpg --score-threshold 0.3 data.val_scale=512
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--checkpoint", required=True, metavar="CKPT", help="detr_peg checkpoint (.pth or .safetensors)")
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="image files or folders, then optional key=value config overrides")
    parser.add_argument("--output", metavar="DIR", default="predictions", help="output folder (default: predictions)")
    parser.add_argument("--score-threshold", type=float, metavar="X",
                        help="keep detections scoring at least X (default: eval.score_threshold)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--batch-size", type=int, default=1, metavar="N", help="images per forward pass (default: 1)")


def _split(inputs: list[str]) -> tuple[list[str], list[str]]:
    """Image paths and key=value overrides (an existing path containing '=' stays a path)."""
    paths, overrides = [], []
    for item in inputs:
        if "=" in item and not Path(item).exists():
            overrides.append(item)
        else:
            paths.append(item)
    return paths, overrides


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from detr_peg.checkpoint.format import load_model
    from detr_peg.data.label_map import LabelMap
    from detr_peg.engine.distributed import resolve_device
    from detr_peg.engine.prediction import collect_images, draw_prediction, predict_images, unique_png_name
    from detr_peg.engine.run_setup import write_json
    from detr_peg.errors import ConfigError, UserError
    from detr_peg.models.builder import build_postprocessor

    paths, overrides = _split(args.inputs)
    if not paths:
        raise ConfigError("predict needs at least one image file or folder.")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {args.batch_size}.")
    images = collect_images(paths)
    device = resolve_device(args.device)
    model = load_model(args.checkpoint, device=device, overrides=overrides)
    threshold = model.config.eval.score_threshold if args.score_threshold is None else args.score_threshold
    label_map = LabelMap.from_dict(model.label_map) if model.label_map else None
    out = Path(args.output)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"Output folder {out} cannot be created ({exc.strerror or exc}).") from None

    records: list[dict] = []
    used: set[str] = set()
    stage = out / f".predict-tmp-{os.getpid()}"
    try:
        stage.mkdir()
        with tqdm(total=len(images), desc="predict", unit="img", disable=not sys.stderr.isatty()) as bar:
            for prediction in predict_images(model, build_postprocessor(model.config), images, label_map=label_map,
                                             score_threshold=threshold, batch_size=args.batch_size, device=device,
                                             progress=bar.update):
                records.extend(prediction.records)
                name = unique_png_name(prediction.path, used)
                try:
                    draw_prediction(prediction).save(stage / name)
                except OSError as exc:
                    raise UserError(f"Could not write {out / name}: {exc.strerror or exc}.") from None
        for name in sorted(used):
            os.replace(stage / name, out / name)
        write_json(out / "predictions.json", records)
    except OSError as exc:
        raise UserError(f"Could not write into {out}: {exc.strerror or exc}.") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    print(f"{len(records)} detections (score >= {threshold:g}) in {len(images)} images; wrote "
          f"{out / 'predictions.json'} and {len(images)} PNG files to {out}.")
    return 0
