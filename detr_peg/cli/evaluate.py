"""Evaluate a checkpoint with COCO bbox mAP on a COCO-format validation set.

The config is the one stored in the checkpoint, then --config (if given),
then key=value overrides; the images and annotations are data.val_images and
data.val_annotations. The metrics table is printed; <output>/metrics.json
holds the twelve COCO numbers (AP, AP50, AP75, APs, APm, APl, AR1, AR10,
AR100, ARs, ARm, ARl) and <output>/detections.json every detection in the
COCO results format, with the dataset's original category ids.

Official DETR/Deformable-DETR checkpoints must be converted first
(detr-peg convert). Several GPUs: torchrun --nproc_per_node N -m detr_peg.cli.main eval ...

Examples:
  detr-peg eval --checkpoint runs/peg/checkpoint.pth
  detr-peg eval --checkpoint detr_r50.pth --config configs/detr_r50_sine.yaml --output runs/official
  detr-peg eval --checkpoint runs/peg/checkpoint.pth data.val_annotations=other/val.json data.val_images=other/images
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--checkpoint", required=True, metavar="CKPT", help="detr_peg checkpoint (.pth or .safetensors)")
    parser.add_argument("--config", metavar="FILE", help="YAML config applied over the checkpoint's own")
    parser.add_argument("--output", metavar="DIR",
                        help="folder for metrics.json and detections.json (default: <checkpoint folder>/eval)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. eval.batch_size=8")


def config_over_checkpoint(checkpoint: str, config_file: str | None, overrides: list[str]):
    """The checkpoint's config, then ``config_file``, then ``overrides``.

    The device is chosen afresh (``train.device=auto``) unless the file or an
    override sets it, so a GPU-trained checkpoint evaluates on a CPU machine.
    """
    from detr_peg.checkpoint.format import read_checkpoint
    from detr_peg.config.loader import config_to_dict, load_config

    stored = config_to_dict(read_checkpoint(checkpoint).config)
    stored["train"].update(device="auto", resume=False)
    return load_config(config_file, overrides, base=stored, base_source=f"config stored in {checkpoint}")


def run(args: argparse.Namespace) -> int:
    from detr_peg.engine.evaluation_run import run_evaluation

    cfg = config_over_checkpoint(args.checkpoint, args.config, args.overrides)
    output = Path(args.output) if args.output else Path(args.checkpoint).resolve().parent / "eval"
    result = run_evaluation(cfg, args.checkpoint, output)
    if result.metrics_file is not None:
        print(f"Wrote {result.metrics_file} and {result.detections_file} ({result.num_detections} detections).")
    return 0
