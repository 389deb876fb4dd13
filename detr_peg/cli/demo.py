"""Generate a synthetic shapes dataset, train a small Deformable-DETR with PEG on the CPU, evaluate it, draw predictions.

Everything goes into the output folder (default outputs/demo):
  data/          the synthetic COCO-format dataset (train/, val/, annotations_*.json),
                 reused when generated with the same parameters
  run/           checkpoint.pth, config.yaml, metrics.jsonl, metrics.json, detections.json
  predictions/   the first --pictures validation images with the boxes drawn (enlarged), and predictions.json

Every demo trains from scratch, replacing <output>/run; --resume continues an
interrupted run instead. The model and recipe are the shipped config demo; the
budget is train.max_iters iterations, the same work on any machine.
--data-only generates (or checks) the dataset and stops (configs/proxy/ and
configs/study/ train on it).

Examples:
  detr-peg demo
  detr-peg demo --data-only
  detr-peg demo --output /tmp/demo train.max_iters=200
  detr-peg demo --num-train 200 --num-val 20 --pictures 4 train.max_iters=50 --score-threshold 0.05
  (50 iterations are a smoke test: expect AP near 0 % and boxes off the shapes; 800 draw sensible boxes)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from detr_peg.cli import option_types

#: Errors about these config keys name the option instead, when it was given.
OPTION_KEYS = {"--resume": "train.resume"}

#: The synthetic dataset of the demo (see detr_peg.data.synthetic): 128 x 128
#: images with one to four shapes, random colours (shapes must be told apart
#: by their outline) on textured backgrounds.
IMAGE_SIZE = 128
MIN_OBJECTS = 1
MAX_OBJECTS = 4
DATA_SEED = 0
COLOR_BY_CLASS = False

#: Pictures smaller than this (longer side, pixels) are enlarged for drawing, so labels stay legible.
DRAW_MIN_SIDE = 384


def default_config() -> Path:
    """The shipped demo config (``configs/demo.yaml``)."""
    from detr_peg.config.shipped import require_shipped

    return require_shipped("demo")


#: The most synthetic images of a split that the demo generates.
MAX_DEMO_IMAGES = 100_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--output", metavar="DIR", default="outputs/demo",
                        help="folder for the dataset, the run and the pictures (default: outputs/demo)")  # fmt: skip
    parser.add_argument("--config", type=option_types.config_file, metavar="FILE",
                        help="model and training config: a file or a shipped config name (default: the shipped demo "
                             "config)")  # fmt: skip
    parser.add_argument("--num-train", type=option_types.integer(1, MAX_DEMO_IMAGES), default=1000, metavar="N",
                        help="synthetic training images (default: 1000)")  # fmt: skip
    parser.add_argument("--num-val", type=option_types.integer(1, MAX_DEMO_IMAGES), default=100, metavar="N",
                        help="synthetic validation images (default: 100)")  # fmt: skip
    parser.add_argument("--pictures", type=option_types.non_negative, default=8, metavar="N",
                        help="validation images to draw predictions on (default: 8)")  # fmt: skip
    parser.add_argument("--score-threshold", type=option_types.fraction, metavar="X",
                        help="draw detections scoring at least X (default: eval.score_threshold of "
                             "the config, 0.35)")  # fmt: skip
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in <output>/run from its checkpoint instead "
                             "of starting afresh")  # fmt: skip
    parser.add_argument("--data-only", action="store_true",
                        help="generate the synthetic dataset in <output>/data and stop (the proxy configs and studies "
                             "train on it)")  # fmt: skip
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.max_iters=200")


def format_elapsed(seconds: float) -> str:
    """``7 min 40 s`` (or ``12 s`` under a minute)."""
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def _config_file(args: argparse.Namespace) -> Path:
    return Path(args.config) if args.config else default_config()


def is_run_file(path: Path) -> bool:
    """Whether a training run writes ``path`` into its folder (hidden names are temporaries)."""
    from detr_peg.engine.training import RUN_NAMES

    return path.name in (*RUN_NAMES, "tensorboard", "eval", "plots") or path.name.startswith(".")


def is_picture_file(path: Path) -> bool:
    """Whether the demo writes ``path`` into its pictures folder."""
    return path.suffix == ".png" or path.name == "predictions.json" or path.name.startswith(".")


def clear_folder(folder: Path, ours: Callable[[Path], bool]) -> None:
    """Remove what a previous demo wrote into ``folder``; raises UserError when it holds anything else."""
    from detr_peg.errors import UserError
    from detr_peg.outputs import OWNERSHIP_FILE

    if not folder.is_dir():
        return
    entries = list(folder.iterdir())
    foreign = [p.name for p in entries if not ours(p)]
    if foreign:
        raise UserError(
            f"{folder} holds files the demo did not write ({', '.join(sorted(foreign)[:3])}); choose another --output."
        )
    for path in entries:
        if path.name == OWNERSHIP_FILE:  # the record that the demo wrote the rest stays
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def draw_pictures(checkpoint: Path, images: list[Path], out: Path, score_threshold: float) -> int:
    """Save a picture per image and ``predictions.json`` into ``out``; return the detections drawn."""
    from PIL import Image

    from detr_peg.cli.predict import predict_files
    from detr_peg.detector import Detector
    from detr_peg.outputs import atomic_write, make_folder, write_json

    detector = Detector.from_checkpoint(checkpoint, device="cpu")
    make_folder(out)
    records: list[dict] = []
    found = predict_files(detector, images, threshold=score_threshold, batch_size=8, desc="pictures")
    for image_id, path, picture, detections in found:
        records.extend(detections.records(image_id))
        factor = max(1, -(-DRAW_MIN_SIDE // max(picture.size)))
        if factor > 1:  # nearest-neighbour enlargement keeps the pixels as the model saw them
            picture = picture.resize((picture.width * factor, picture.height * factor), Image.NEAREST)
            detections.boxes = detections.boxes * factor
            detections.image_size = (picture.height, picture.width)
        drawn = detections.draw(picture)
        atomic_write(out / f"{path.stem}.png", lambda handle, drawn=drawn: drawn.save(handle, format="PNG"))
    write_json(out / "predictions.json", records)
    return len(records)


def run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as claims:  # the output folders' claims, settled on leaving
        start = time.perf_counter()
        config_file = _config_file(args)
        from detr_peg.config.loader import load_config
        from detr_peg.data.synthetic import generate_synthetic_coco
        from detr_peg.engine.training import RUN_NAMES
        from detr_peg.outputs import Output, guard_outputs, inputs

        out = Path(args.output)
        run_dir, pictures_dir = out / "run", out / "predictions"
        # Validate the config before spending time on the data.
        load_config(config_file, args.overrides)
        data_names = ("annotations_train.json", "annotations_val.json", "manifest.json", "train", "val")
        outputs = [  # the folders inside first, so a refusal names the file of the user's rather than its folder
            Output(out / "data", "--output", data_names),
            Output(run_dir, "--output", RUN_NAMES, kind="train"),
            Output(pictures_dir, "--output", ("predictions.json",)),
            Output(args.output, "--output", ("data", "run", "predictions")),
        ]
        claims.enter_context(guard_outputs("demo", inputs((config_file, "--config")), outputs))

        print(
            f"demo: synthetic dataset in {out / 'data'} ({args.num_train} training, {args.num_val} validation images)",
            flush=True,
        )
        data = generate_synthetic_coco(
            out / "data",
            num_train=args.num_train,
            num_val=args.num_val,
            image_size=IMAGE_SIZE,
            min_objects=MIN_OBJECTS,
            max_objects=MAX_OBJECTS,
            seed=DATA_SEED,
            color_by_class=COLOR_BY_CLASS,
            progress=sys.stderr.isatty(),
        )
        if args.data_only:
            print(f"demo: dataset {data.root} ({format_elapsed(time.perf_counter() - start)})")
            return 0
        # The demo's own data and folders come last, so they win over the file and the overrides.
        demo_values = [f"data.{key}={value}" for key, value in data.data_overrides().items()]
        demo_values += [f"train.output_dir={json.dumps(str(run_dir))}", f"train.resume={str(args.resume).lower()}"]
        cfg = load_config(config_file, [*args.overrides, *demo_values])

        if not args.resume:
            clear_folder(run_dir, is_run_file)
        clear_folder(pictures_dir, is_picture_file)

        from detr_peg.engine.evaluation.metric_units import format_percent
        from detr_peg.engine.run_hints import no_detections_note
        from detr_peg.engine.training import run_training

        print(
            f"demo: training {config_file.name} for {cfg.train.max_iters or cfg.train.epochs} "
            f"{'iterations' if cfg.train.max_iters else 'epochs'} in {run_dir}",
            flush=True,
        )
        result = run_training(cfg)
        metrics = result.metrics or {}

        images = sorted(data.val_images.glob("*.png"))[: args.pictures]
        threshold = cfg.eval.score_threshold if args.score_threshold is None else args.score_threshold
        drawn = draw_pictures(result.checkpoint, images, pictures_dir, threshold) if images else 0

        elapsed = format_elapsed(time.perf_counter() - start)
        print(
            f"demo: dataset {data.root}; checkpoint {result.checkpoint}; metrics {result.metrics_file}; "
            f"{drawn} detections (score >= {threshold:g}) drawn on {len(images)} pictures in {pictures_dir}"
        )
        print(
            f"demo: AP50 {format_percent(metrics.get('AP50'))} (AP {format_percent(metrics.get('AP'))}) on "
            f"{args.num_val} synthetic validation images after {result.iterations} iterations ({elapsed}); "
            f"pictures in {pictures_dir}/"
        )
        if images and not drawn:
            print(no_detections_note(threshold, result.iterations, "--score-threshold"))
        return 0
