r"""Export a checkpoint to ONNX: one graph for any batch size and image size, checked in ONNX Runtime.

Inputs: "images" float32[B, 3, H, W] (padded, normalised) and "mask" bool[B, H, W]
(True = padding); outputs "pred_logits" and "pred_boxes" (normalised cx, cy, w, h
of each unpadded image). --postprocess adds the input "orig_sizes" int64[B, 2]
(h, w) and the outputs "scores", "labels", "boxes" (x0, y0, x1, y1 pixels).
Batch, height and width are dynamic unless --batch-size / --image-size fix them.
The config and label map are stored in the file (`detr-peg predict --onnx FILE`
needs nothing else). Unless --no-check, the graph is run in ONNX Runtime on a
batch of another size than the traced one and compared with PyTorch.

Needs the onnx extra: pip install onnx onnxscript onnxruntime.

Examples:
  detr-peg export --checkpoint runs/peg/checkpoint.pth --output model.onnx
  detr-peg export --checkpoint runs/peg/checkpoint.pth --output model_800.onnx --image-size 800 1066 --postprocess
"""

from __future__ import annotations

import argparse
import contextlib

from detr_peg.cli import option_types
from detr_peg.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from detr_peg.config.ranges import MAX_TEST_SIDE
    from detr_peg.export import DEFAULT_OPSET

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--checkpoint", required=True, metavar="CKPT",
                        help="detr_peg checkpoint (.pth or .safetensors)")  # fmt: skip
    parser.add_argument("--output", required=True, metavar="FILE", help="the .onnx file to write")
    parser.add_argument("--opset", type=option_types.integer(DEFAULT_OPSET), default=DEFAULT_OPSET, metavar="N",
                        help=f"ONNX opset (default: {DEFAULT_OPSET}, the tested one)")  # fmt: skip
    parser.add_argument("--image-size", type=option_types.integer(32, MAX_TEST_SIDE), nargs=2, metavar=("H", "W"),
                        help="fix the padded image size; smaller images are padded up to it, which shifts their "
                             "detections (default: dynamic)")  # fmt: skip
    parser.add_argument("--batch-size", type=option_types.integer(1), metavar="N",
                        help="fix the batch size (default: dynamic)")  # fmt: skip
    parser.add_argument("--postprocess", action="store_true",
                        help="add orig_sizes input and scores/labels/boxes outputs")  # fmt: skip
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="do not compare the written graph with PyTorch in ONNX Runtime")  # fmt: skip
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config changes that do not alter weights (eval.num_select=50)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as claims:  # the output folders' claims, settled on leaving
        from detr_peg.checkpoint.files import check_checkpoint_location
        from detr_peg.export.export_options import check_export_options, require_onnx

        # Refused before torch and the models are imported and before anything is read or written.
        require_onnx()
        check_export_options(args.opset, args.image_size, args.batch_size)
        check_checkpoint_location(args.checkpoint)

        from detr_peg.export.onnx_export import export_onnx
        from detr_peg.export.onnx_runtime import compare_with_pytorch
        from detr_peg.models.loading import load_model
        from detr_peg.outputs import Output, guard_outputs, inputs

        claims.enter_context(
            guard_outputs("export", inputs((args.checkpoint, "--checkpoint")), [Output(args.output, "--output")])
        )
        model = load_model(args.checkpoint, overrides=args.overrides, overrides_source="command line")
        diffs = []  # the check runs before the graph replaces --output: a failed one leaves an earlier file

        def check(written):
            try:
                diffs.append(
                    compare_with_pytorch(model.model, written, batch_size=args.batch_size, image_size=args.image_size)
                )
            except UserError as exc:  # said of the file the user asked for, not of the temporary one
                raise type(exc)(
                    str(exc).replace(str(written), f"the exported graph (not written to {args.output})")
                ) from None

        path = export_onnx(
            model,
            args.output,
            opset=args.opset,
            image_size=tuple(args.image_size or ()) or None,
            batch_size=args.batch_size,
            postprocess=args.postprocess,
            check=check if args.check else None,
        )
        print(
            f"wrote {path} (opset {args.opset}; batch {args.batch_size or 'dynamic'}, "
            f"size {'x'.join(map(str, args.image_size)) if args.image_size else 'dynamic'})"
        )
        data = model.config.data
        if args.image_size and max(data.val_scale, data.val_max_size) > min(args.image_size):
            print(f"Note: this config resizes images to {data.val_scale} px on the short side, up to "
                  f"{data.val_max_size} on the long one; the graph refuses a padded image beyond "
                  f"{'x'.join(map(str, args.image_size))}: lower data.val_scale and data.val_max_size (overrides "
                  "of predict --onnx), or export without --image-size.")  # fmt: skip
        if diffs:
            print(f"checked in ONNX Runtime against PyTorch: largest difference {diffs[0]:.2e}")
        return 0
