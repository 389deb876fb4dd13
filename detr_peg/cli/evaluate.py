"""Evaluate a checkpoint with COCO bbox mAP on a COCO-format validation set.

The config is the checkpoint's own, then --config (if given), then key=value
overrides; the data are data.val_images and data.val_annotations. The metrics
table is printed; <output>/metrics.json holds the twelve COCO numbers (AP,
AP50, AP75, APs, APm, APl, AR1, AR10, AR100, ARs, ARm, ARl) in percent and
<output>/detections.json every detection in the COCO results format, with the
dataset's original category ids.

Multi-resolution evaluation (files next to metrics.json; see the documentation, "Evaluation"):
  --scales 1,1.5,2        the validation images resized to these multiples of data.val_scale and
                          data.val_max_size -> scales_resized.json
  --canvas-scales 1.5,2   synthetic data only: validation images on a canvas this many times larger
                          whose objects keep the training sizes, generated once next to the dataset
                          -> scales_canvas.json
  --padding               mixed-size batches vs one image at a time vs eval.padding_mode=exact
                          -> padding.json

Official DETR/Deformable-DETR checkpoints must be converted first
(detr-peg convert). Several GPUs: torchrun --nproc_per_node N -m detr_peg.cli.main eval ...

Examples:
  detr-peg eval --checkpoint runs/peg/checkpoint.pth
  detr-peg eval --checkpoint detr_r50.pth --config configs/detr_r50_sine.yaml --output runs/official
  detr-peg eval --checkpoint runs/peg/checkpoint.pth data.val_annotations=other/val.json data.val_images=other/images
  detr-peg eval --checkpoint runs/peg/checkpoint.pth --scales 0.75,1,1.5,2 --canvas-scales 1.5,2 --padding
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from detr_peg.cli import option_types

#: Errors about these config keys name the option instead, when it was given (the folder checks name the run's).
OPTION_KEYS = {"--output": "train.output_dir"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--checkpoint", required=True, metavar="CKPT",
                        help="detr_peg checkpoint (.pth or .safetensors)")  # fmt: skip
    parser.add_argument("--config", type=option_types.config_file, metavar="FILE",
                        help="config file or shipped config name applied over the checkpoint's own")  # fmt: skip
    parser.add_argument("--output", metavar="DIR",
                        help="folder for metrics.json and detections.json "
                             "(default: <checkpoint folder>/eval)")  # fmt: skip
    parser.add_argument("--scales", type=option_types.scale_list, default=[], metavar="S1,S2,...",
                        help="also evaluate the validation images resized by "
                             "these factors (scales_resized.json)")  # fmt: skip
    parser.add_argument("--canvas-scales", type=option_types.scale_list, default=[], metavar="S1,S2,...",
                        help="synthetic data: also evaluate on canvases this many times larger, objects at their "
                             "training size (scales_canvas.json)")  # fmt: skip
    parser.add_argument("--padding", action="store_true",
                        help="also measure the effect of batch padding (padding.json)")  # fmt: skip
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. eval.batch_size=8")


def config_over_checkpoint(checkpoint, config_file: str | None, overrides: list[str]):
    """The checkpoint's config, then ``config_file``, then ``overrides``; ``train.device`` is auto unless set."""
    from detr_peg.config.loader import config_to_dict, load_config

    stored = config_to_dict(checkpoint.config)
    stored["train"].update(device="auto", resume=False)
    return load_config(config_file, overrides, base=stored, base_source=f"config stored in {checkpoint.path}")


def run(args: argparse.Namespace) -> int:
    from detr_peg.checkpoint.files import check_checkpoint_location
    from detr_peg.config.loader import check_config_file

    # Inputs that are not there are refused before torch and the models are imported.
    check_checkpoint_location(args.checkpoint)
    if args.config:
        check_config_file(args.config)

    from detr_peg.checkpoint.format import read_checkpoint
    from detr_peg.detector import Detector
    from detr_peg.engine.distributed import on_main, process_group
    from detr_peg.engine.evaluation.run import eval_io
    from detr_peg.outputs import Input, all_or_nothing, guard_outputs

    checkpoint = read_checkpoint(args.checkpoint)  # read once for every evaluation of the command
    cfg = config_over_checkpoint(checkpoint, args.config, args.overrides)
    if args.scales or args.canvas_scales:
        from detr_peg.engine.evaluation.scales import canvas_side, check_scales, synthetic_params

        # Refused before the first evaluation and before anything is written.
        check_scales(cfg.data, args.scales, args.canvas_scales)
        if args.canvas_scales:
            _, params = synthetic_params(cfg.data)
            for scale in args.canvas_scales:
                if scale != 1:
                    canvas_side(params, scale)
    output = Path(args.output) if args.output else Path(args.checkpoint).resolve().parent / "eval"
    config_input = [Input(Path(args.config), "--config")] if args.config else []
    # One process group for every evaluation of the command, and one claim on the output folder for all of
    # them (each evaluation's own claim inside it adds nothing: the names stay claimed until the command ends).
    with process_group(cfg.train.device) as env, contextlib.ExitStack() as claims:
        reads, writes = eval_io(cfg, args.checkpoint, output, config_input)
        owned = on_main(env, lambda: guard_outputs("eval", reads, writes))
        if owned is not None:
            claims.enter_context(owned)
            # Every analysis or none: one that fails (out of memory at a large scale) leaves the folder as it was.
            claims.enter_context(all_or_nothing([target for out in writes for target in out.targets()]))
        detector = Detector.from_checkpoint(checkpoint, config=cfg, device=env.device)
        detector.evaluate(output_dir=output, extra_inputs=config_input)
        if env.is_main:
            print(f"Wrote {output / 'metrics.json'} and {output / 'detections.json'}.")
        if args.scales or args.canvas_scales or args.padding:
            written = detector.evaluate_scales(
                output, scales=args.scales, canvas_scales=args.canvas_scales, padding=args.padding
            )
            if written:
                print(f"Wrote {', '.join(str(path) for path in written.values())}.")
    return 0
