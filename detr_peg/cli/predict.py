"""Detect objects in images; write predictions.json and one PNG per image with the boxes drawn.

The model is a checkpoint (PyTorch) or, with --onnx, a graph written by
`detr-peg export` (ONNX Runtime on the CPU); both give the same files.

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
  detr-peg predict --onnx model.onnx photos/ --output predictions
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from detr_peg.cli import option_types

#: Words left after the options (image paths and key=value overrides) join ``inputs``.
POSITIONAL_DEST = "inputs"
#: Errors about these config keys name the option instead, when it was given.
OPTION_KEYS = {"--device": "train.device"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", metavar="CKPT", help="detr_peg checkpoint (.pth or .safetensors)")
    source.add_argument(
        "--onnx", metavar="FILE", help="a graph from `detr-peg export`, run in ONNX Runtime on the CPU instead"
    )
    parser.add_argument(
        "inputs", nargs="+", metavar="INPUT", help="image files or folders, then optional key=value config overrides"
    )
    parser.add_argument("--output", metavar="DIR", default="predictions", help="output folder (default: predictions)")
    parser.add_argument(
        "--score-threshold",
        type=option_types.fraction,
        metavar="X",
        help="keep detections scoring at least X (default: eval.score_threshold)",
    )
    parser.add_argument(
        "--device", type=option_types.device, default="auto", help="auto, cpu, cuda or cuda:N (default: auto)"
    )
    parser.add_argument(
        "--batch-size", type=option_types.positive, default=1, metavar="N", help="images per forward pass (default: 1)"
    )


def _split(inputs: list[str]) -> tuple[list[str], list[str]]:
    """Image paths and key=value overrides (an existing path containing '=' stays a path)."""
    paths, overrides = [], []
    for item in inputs:
        if "=" in item and not Path(item).exists():
            overrides.append(item)
        else:
            paths.append(item)
    return paths, overrides


def _onnx_model(path: str, overrides: list[str]):
    """The exported graph in ONNX Runtime, with the config and label map stored in it."""
    from detr_peg.errors import CheckpointError
    from detr_peg.export.onnx_runtime import OnnxDetector

    model = OnnxDetector(path, overrides=overrides)
    if model.config is None:
        raise CheckpointError(f"{path} holds no detr_peg config; export it with `detr-peg export`.")
    return model


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from detr_peg.data.label_map import LabelMap
    from detr_peg.engine.distributed import resolve_device
    from detr_peg.engine.prediction import collect_images, draw_prediction, predict_images, unique_png_name
    from detr_peg.engine.run_setup import write_json
    from detr_peg.errors import ConfigError, UserError
    from detr_peg.guards.declared_io import predict_io
    from detr_peg.guards.output_guard import guard_outputs
    from detr_peg.models.builder import build_postprocessor
    from detr_peg.models.loading import load_model

    paths, overrides = _split(args.inputs)
    if not paths:
        raise ConfigError("predict needs at least one image file or folder.")
    images = collect_images(paths)
    png_names: set[str] = set()
    for image in images:
        unique_png_name(image, png_names)
    model_file, model_option = (args.onnx, "--onnx") if args.onnx else (args.checkpoint, "--checkpoint")
    guard_outputs("predict", *predict_io(paths, model_file, args.output, sorted(png_names), model_option=model_option))
    if args.onnx:
        model = _onnx_model(args.onnx, overrides)
        device = torch.device("cpu")
    else:
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
            for prediction in predict_images(
                model,
                build_postprocessor(model.config),
                images,
                label_map=label_map,
                score_threshold=threshold,
                batch_size=args.batch_size,
                device=device,
                progress=bar.update,
            ):
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
    print(
        f"{len(records)} detections (score >= {threshold:g}) in {len(images)} images; wrote "
        f"{out / 'predictions.json'} and {len(images)} PNG files to {out}."
    )
    return 0
