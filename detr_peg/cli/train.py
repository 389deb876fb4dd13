"""Train a detector on a COCO-format dataset.

The config is a YAML file (see configs/) plus key=value overrides; the
resolved config is written to <output>/config.yaml. The output folder gets
checkpoint.pth (replaced atomically after every epoch), metrics.jsonl,
metrics.json and detections.json of the last evaluation.

Ctrl-C or SIGTERM stops after the current iteration and writes the
checkpoint (exit status 130 or 143); --resume continues exactly where it
stopped. A second Ctrl-C stops at once, keeping the previous checkpoint.

The total batch is train.batch_size x the number of processes. Several GPUs
or machines: start the same command with torchrun, e.g.
  torchrun --nproc_per_node 8 -m detr_peg.cli.main train --config configs/detr_r50_peg.yaml

Examples:
  detr-peg train --config configs/detr_r50_peg.yaml --output runs/peg
  detr-peg train --config configs/detr_r50_peg.yaml --output runs/peg --resume
  detr-peg train --config configs/detr_r50_peg.yaml data.train_images=my/images \\
      data.train_annotations=my/train.json data.val_images=my/images data.val_annotations=my/val.json
  detr-peg train --config configs/detr_r50_peg.yaml --print-config
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import yaml

from detr_peg.cli import option_types

#: Errors about these config keys name the option instead, when it was given.
OPTION_KEYS = {"--output": "train.output_dir", "--resume": "train.resume"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--config", type=option_types.config_file, metavar="FILE",
                        help="config file, or the name of a shipped config: detr_r50_peg "
                             "(detr-peg configs list)")  # fmt: skip
    parser.add_argument("--output", metavar="DIR", help="output folder (sets train.output_dir)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from <output>/checkpoint.pth if it exists (sets train.resume=true); without "
                             "--config, with the run's own <output>/config.yaml")  # fmt: skip
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config and the recipe it gives, then exit")  # fmt: skip
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.lr=2e-4")


def resolve(args: argparse.Namespace):
    """The config of the command: file, then overrides, then --output/--resume."""
    from detr_peg.config.loader import load_config

    overrides, config = list(args.overrides), args.config
    if args.output is not None:
        overrides.append(f"train.output_dir={json.dumps(args.output)}")  # a string, whatever YAML would read
    if args.resume:
        overrides.append("train.resume=true")
        if config is None and args.output is not None and os.path.isfile(os.path.join(args.output, "config.yaml")):
            config = os.path.join(args.output, "config.yaml")  # the run's own, as it wrote it
        elif config is None and not any(word.startswith("data.train_images=") for word in overrides):
            from detr_peg.errors import ConfigError

            raise ConfigError("--resume without --config needs --output, the folder of the run to resume." if args.output
                              is None else f"--resume: {args.output} holds no run to resume (no config.yaml); give "
                              "--output the folder of a run, or --config to start one.")  # fmt: skip
    return load_config(config, overrides)


def recipe_summary(cfg) -> str:
    """One comment block stating the optimisation recipe of ``cfg`` as this command would run it."""
    t = cfg.train
    world_size = int(os.environ.get("WORLD_SIZE") or 1)
    total = t.batch_size * world_size
    recipe = ""
    if t.total_batch_size and t.total_batch_size != total:
        recipe = f" (the recipe's total is {t.total_batch_size}"
        if t.total_batch_size % t.batch_size == 0:
            processes = t.total_batch_size // t.batch_size
            recipe += f": {processes} processes, torchrun --nproc-per-node {processes}"
        recipe += ")"
    budget = f"; ends after {t.max_iters} iterations (train.max_iters)" if t.max_iters else ""
    warmup = f", linear warm-up over the first {t.warmup_iters} iterations" if t.warmup_iters else ""
    lines = [
        f"# recipe: AdamW, lr {t.lr:g} (backbone {t.lr_backbone:g}), weight decay {t.weight_decay:g}, "
        f"gradient clipping {t.clip_max_norm:g}",
        f"# schedule: {t.epochs} epochs, StepLR x{t.lr_gamma:g} every {t.lr_drop} epochs{warmup}{budget}",
        f"# batch: {t.batch_size} per process x {world_size} process{'es' if world_size > 1 else ''} = total "
        f"{total}{recipe}",
    ]
    if t.lr_linear_proj_mult != 1.0:
        lines.append(
            f"# parameters named {', '.join(t.lr_linear_proj_names)} (where the model has them): "
            f"lr x{t.lr_linear_proj_mult:g}"
        )
    return "\n".join(lines)


def _as_comment(record: logging.LogRecord) -> bool:
    record.msg, record.args = f"# {record.getMessage()}", ()
    return True


def run(args: argparse.Namespace) -> int:
    from detr_peg.config.loader import config_to_dict

    if not args.print_config:
        cfg = resolve(args)
    else:  # the notes of reading the config become YAML comments: the output stays a config file
        handlers = logging.getLogger("detr_peg").handlers
        for handler in handlers:
            handler.addFilter(_as_comment)
        try:
            cfg = resolve(args)
        finally:
            for handler in handlers:
                handler.removeFilter(_as_comment)
        from detr_peg.models.builder import check_buildable

        check_buildable(cfg)  # what train would refuse when it builds the model, refused here too
        sys.stdout.write(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        print(recipe_summary(cfg))
        return 0
    from detr_peg.engine.training import run_training

    run_training(cfg)
    return 0
