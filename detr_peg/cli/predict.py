"""Detect objects in images; write predictions.json and one PNG per image with the boxes drawn.

The model is a checkpoint (PyTorch) or, with --onnx, a graph written by
`detr-peg export` (ONNX Runtime on the CPU); both give the same files.

Inputs are image files and/or folders (every image inside, recursively),
each image once.
predictions.json is a list of COCO-style results with the file name added:
{"image_id", "file_name", "category_id", "category_name", "bbox": [x, y, w, h],
"score"}, in pixels of the original image, for detections scoring at least
--score-threshold (default: eval.score_threshold of the checkpoint's config).
Category ids and names come from the dataset the model was trained on.
Pictures and predictions.json are published only once every image is done, so
a failed run leaves the files of an earlier run as they were; a finished run
removes the pictures an earlier predict drew in --output of other images.

Examples:
  detr-peg predict --checkpoint runs/peg/checkpoint.pth photos/ --output predictions
  detr-peg predict --checkpoint runs/peg/checkpoint.pth a.jpg b.jpg --score-threshold 0.3 data.val_scale=512
  detr-peg predict --onnx model.onnx photos/ --output predictions
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
from pathlib import Path

from detr_peg.cli import option_types

#: The folder inside --output where pictures wait until every image succeeded (then moved into place).
STAGE_PREFIX = ".predict-tmp-"

#: Words left after the options (image paths and key=value overrides) join ``inputs``.
POSITIONAL_DEST = "inputs"
#: Errors about these config keys name the option instead, when it was given.
OPTION_KEYS = {"--device": "train.device"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", metavar="CKPT", help="detr_peg checkpoint (.pth or .safetensors)")
    source.add_argument("--onnx", metavar="FILE",
                        help="a graph from `detr-peg export`, run in ONNX Runtime on the CPU instead")  # fmt: skip
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="image files or folders, then optional key=value config overrides")  # fmt: skip
    parser.add_argument("--output", metavar="DIR", default="predictions", help="output folder (default: predictions)")
    parser.add_argument("--score-threshold", type=option_types.fraction, metavar="X",
                        help="keep detections scoring at least X (default: eval.score_threshold)")  # fmt: skip
    parser.add_argument("--device", type=option_types.device, default="auto",
                        help="auto, cpu, cuda or cuda:N (default: auto)")  # fmt: skip
    parser.add_argument("--batch-size", type=option_types.positive, default=8, metavar="N",
                        help="most images per forward pass; images of equal size are batched, so results do not depend "
                             "on it (default: 8)")  # fmt: skip


def _split(inputs: list[str]) -> tuple[list[str], list[str]]:
    """Image paths and key=value overrides (an existing path containing '=' stays a path)."""
    paths, overrides = [], []
    for item in inputs:
        if "=" in item and not Path(item).exists():
            overrides.append(item)
        else:
            paths.append(item)
    return paths, overrides


#: Images decoded and held in memory at once (the Detector batches them by size).
CHUNK = 64
logger = logging.getLogger(__name__)


def unique_png_name(path: Path, used: set[str]) -> str:
    """``<stem>.png``, or ``<stem>_2.png``, ... when an earlier input had the same stem."""
    name, n = f"{path.stem}.png", 1
    while name in used:
        n += 1
        name = f"{path.stem}_{n}.png"
    used.add(name)
    return name


def predict_files(detector, images: list[Path], *, threshold: float, batch_size: int, desc: str = "predict"):
    """Yield ``(image_id, path, picture, detections)`` per file, in order, decoding :data:`CHUNK` at a time; progress
    is a bar on a terminal, else a log line at each tenth of 100 images or more."""
    from tqdm import tqdm

    from detr_peg.data.image_input import load_rgb_image

    terminal, total = sys.stderr.isatty(), len(images)
    with tqdm(total=total, desc=desc, unit="img", leave=False, disable=not terminal) as bar:
        for start in range(0, total, CHUNK):
            paths = images[start : start + CHUNK]
            pictures = [load_rgb_image(path) for path in paths]
            found = detector.predict(pictures, threshold=threshold, batch_size=batch_size)
            for offset, (path, picture, detections) in enumerate(zip(paths, pictures, found)):
                detections.source, done = str(path), start + offset + 1
                bar.update(1)
                if not terminal and total >= 100 and done * 10 // total > (done - 1) * 10 // total:
                    logger.info("%s: %d of %d images", desc, done, total)
                yield done, path, picture, detections


def checked_inputs(args: argparse.Namespace) -> tuple[list[str], list[str], list[Path]]:
    """The image inputs, overrides and image files, with the model file checked, before torch is imported.

    Raises UserError: no image input, or an input or the model file that is not there.
    """
    from detr_peg.checkpoint.files import check_checkpoint_file, check_checkpoint_location
    from detr_peg.data.image_paths import collect_images
    from detr_peg.errors import ConfigError

    paths, overrides = _split(args.inputs)
    if not paths:
        raise ConfigError("predict needs at least one image file or folder.")
    images = collect_images(paths)
    if args.onnx:  # a local file: ONNX Runtime reads no URL
        from detr_peg.export.export_options import require_onnx

        if args.device not in ("auto", "cpu"):
            raise ConfigError(f"--device {args.device}: --onnx runs in ONNX Runtime on the CPU; leave --device out.")

        require_onnx()
        check_checkpoint_file(args.onnx, "ONNX model")
    else:
        check_checkpoint_location(args.checkpoint)
    return paths, overrides, images


def run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as claims:  # the output folders' claims, settled on leaving
        paths, overrides, images = checked_inputs(args)
        model_file, model_option = (args.onnx, "--onnx") if args.onnx else (args.checkpoint, "--checkpoint")

        from detr_peg.detector import Detector
        from detr_peg.engine.run_hints import no_detections_note, short_training_note
        from detr_peg.outputs import (
            Output,
            guard_outputs,
            inputs,
            make_folder,
            owned_names,
            remove_stale,
            write_error,
            write_json,
            writing,
        )

        png_names: set[str] = set()
        for image in images:
            unique_png_name(image, png_names)
        # An earlier predict's pictures of other images go when this one's are published: predictions.json
        # no longer lists them.
        earlier = {n for n, by in owned_names(Path(args.output)).items() if by == "predict" and n.endswith(".png")}
        earlier -= png_names
        reads = inputs(*((p, "INPUT") for p in paths), (model_file, model_option))
        names = ("predictions.json", *sorted(png_names | earlier))
        claims.enter_context(guard_outputs("predict", reads, [Output(args.output, "--output", names)]))
        if args.onnx:
            detector = Detector.from_onnx(args.onnx, overrides=overrides)
        else:
            from detr_peg.engine.distributed import resolve_device  # its errors name train.device, said --device

            device = resolve_device(args.device)
            detector = Detector.from_checkpoint(args.checkpoint, device=device, overrides=overrides,
                                                overrides_source="command line")  # fmt: skip
        threshold = detector.config.eval.score_threshold if args.score_threshold is None else args.score_threshold
        out = Path(args.output)
        make_folder(out)

        records: list[dict] = []
        used: set[str] = set()
        remove_stale(out, STAGE_PREFIX)  # the staging of a predict that was killed
        stage = out / f"{STAGE_PREFIX}{os.getpid()}"
        try:
            stage.mkdir()
            found = predict_files(detector, images, threshold=threshold, batch_size=args.batch_size)
            for image_id, path, picture, detections in found:
                records.extend(detections.records(image_id))
                name = unique_png_name(path, used)
                with writing(out / name):
                    detections.draw(picture).save(stage / name)
            write_json(out / "predictions.json", records)  # first: if it cannot be replaced, no picture is either
            for name in sorted(used):
                os.replace(stage / name, out / name)
            for name in sorted(earlier):
                (out / name).unlink(missing_ok=True)
        except OSError as exc:
            raise write_error(out, exc, "write into") from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        print(
            f"{len(records)} detections (score >= {threshold:g}) in {len(images)} images; wrote "
            f"{out / 'predictions.json'} and {len(images)} PNG files to {out}."
        )
        iterations = detector.loaded.iteration  # None for an ONNX graph or a converted official checkpoint
        note = (
            short_training_note(iterations)
            if records
            else no_detections_note(threshold, iterations, "--score-threshold")
        )
        if note:
            print(note)
        if detector.label_map is None:
            print(f"Note: {model_file} holds no label map, so category_id is the model's class index and each name "
                  "is 'class N'.")  # fmt: skip
        return 0
