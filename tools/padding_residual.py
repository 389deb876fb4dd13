"""What batch padding still changes in a model whose padding masks are exact: its backbone features and its logits.

For each of the first ``--count`` images of ``--images`` (by path), preprocessed as the model's
evaluation does, the image alone is compared with the same image grown on the right and bottom by
``--extra`` of its size, rounded up to the model's ``size_divisibility``, with its exact padding mask (the
padded batches of ``detr-peg eval --padding``):

* every backbone level, over the cells the image has alone: the largest absolute difference in the cells
  of its last row and column (``border``: their receptive fields reach the padding through the
  convolutions' own zero padding alone, and through the padded area's features on the canvas) and in the
  others (``inside``), beside the level's largest absolute activation (``largest_activation``);
* the model's logits (``logits``): the largest absolute difference over all queries and classes;
* the model's boxes (``boxes``): the median, over every query of every image, of the padded run's box
  centre and size divided by the image-alone ones (``cx``, ``cy``, ``w``, ``h``; both runs' boxes are
  normalised ``(cx, cy, w, h)`` that post-processing scales by the image's size), beside the median
  fraction of the canvas that the image covers (``canvas_fraction``, ``x`` and ``y``). Ratios of 1: the
  boxes stay where they were; ratios equal to the canvas fraction: the model places its boxes on the
  canvas as if it were the image.

Prints one JSON object; ``--output FILE`` writes it too. Bad input (an option out of range, no such
checkpoint or folder, an unreadable image or folder) is one line on stderr and exit status 2.

    python tools/padding_residual.py --checkpoint RUN/checkpoint.pth --images outputs/proxy_data/data/val --count 16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
from torchvision import tv_tensors  # noqa: E402

from detr_peg.cli import option_types  # noqa: E402
from detr_peg.cli.json_report import run_json_report  # noqa: E402
from detr_peg.cli.main import OneLineParser  # noqa: E402
from detr_peg.data.image_input import as_rgb_tensor  # noqa: E402
from detr_peg.data.image_paths import collect_images  # noqa: E402
from detr_peg.data.padding import (
    pad_further,  # noqa: E402
    pad_images,  # noqa: E402
)
from detr_peg.data.transforms import build_eval_transforms  # noqa: E402
from detr_peg.detector import Detector  # noqa: E402
from detr_peg.engine.evaluation.padding import EXTRA_PADDING  # noqa: E402
from detr_peg.errors import DataError  # noqa: E402


def residual(detector: Detector, images: list[Path], extra: float) -> dict:
    """The largest differences between each image alone and padded (see the module docstring).

    Args:
        detector: the model, in evaluation mode on the CPU.
        images: image files.
        extra: the growth of the canvas, relative to the image's size (before rounding up).

    Returns:
        ``{"images", "extra_padding", "levels": [{"border", "inside", "largest_activation"}, ...],
        "logits", "boxes": {"median_ratio": {"cx", "cy", "w", "h"}, "canvas_fraction": {"x", "y"}}}``:
        the maxima over the images, and the boxes' medians.
    """
    model = detector.model.eval()
    transform = build_eval_transforms(detector.config.data)
    levels: list[dict[str, float]] = []
    logits = 0.0
    ratios, fractions = [], []  # Tensor[Q, 4] and Tensor[2] per image
    for path in images:
        pixels = transform(tv_tensors.Image(as_rgb_tensor(path, name=str(path))))
        alone, alone_mask = pad_images([pixels], model.size_divisibility)
        padded, padded_mask = pad_further(alone, alone_mask, extra, model.size_divisibility)
        with torch.no_grad():
            own, grown = model.backbone(alone), model.backbone(padded)
            for i, (a, b) in enumerate(zip(own, grown)):
                if len(levels) <= i:
                    levels.append({"border": 0.0, "inside": 0.0, "largest_activation": 0.0})
                diff = (a - b[..., : a.shape[-2], : a.shape[-1]]).abs()
                border = torch.cat([diff[..., -1, :].flatten(), diff[..., :, -1].flatten()]).max()
                level = levels[i]
                level["border"] = max(level["border"], float(border))
                if diff[..., :-1, :-1].numel():  # a level of one row or column has no inside
                    level["inside"] = max(level["inside"], float(diff[..., :-1, :-1].max()))
                level["largest_activation"] = max(level["largest_activation"], float(a.abs().max()))
            out_alone, out_padded = model(alone, alone_mask), model(padded, padded_mask)
            logits = max(logits, float((out_alone["pred_logits"] - out_padded["pred_logits"]).abs().max()))
        ratios.append(out_padded["pred_boxes"][0] / out_alone["pred_boxes"][0])
        valid = ~alone_mask[0]  # the image's own pixels: True where it is not padding
        height, width = int(valid[:, 0].sum()), int(valid[0].sum())
        fractions.append(torch.tensor([width / padded.shape[-1], height / padded.shape[-2]]))
    medians = torch.cat(ratios).median(dim=0).values.tolist()
    fraction = torch.stack(fractions).median(dim=0).values.tolist()
    boxes = {
        "median_ratio": dict(zip(("cx", "cy", "w", "h"), medians)),
        "canvas_fraction": dict(zip(("x", "y"), fraction)),
    }
    return {"images": len(images), "extra_padding": extra, "levels": levels, "logits": logits, "boxes": boxes}


def image_files(folder: Path, count: int) -> list[Path]:
    """The first ``count`` images of ``folder`` (:func:`~detr_peg.data.image_paths.collect_images`: by path,
    subfolders included); DataError when it is not a folder or holds no image."""
    if not folder.is_dir():
        raise DataError(f"--images {folder} is not a folder.")
    return collect_images([folder])[:count]


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="padding_residual.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True, metavar="FILE", help="a detr-peg checkpoint")
    parser.add_argument("--images", required=True, type=Path, metavar="DIR", help="a folder of images")
    parser.add_argument("--count", type=option_types.integer(1), default=16, metavar="N",
                        help="images to use (default 16)")  # fmt: skip
    parser.add_argument("--extra", type=option_types.number(0.01, 10.0), default=EXTRA_PADDING, metavar="F",
                        help=f"canvas growth, a fraction of the image's size (default {EXTRA_PADDING})")  # fmt: skip
    parser.add_argument("--output", type=Path, metavar="FILE", help="also write the JSON object here")
    args = parser.parse_args(argv)
    return run_json_report("padding_residual.py", lambda: report(args), args.output)


def report(args: argparse.Namespace) -> dict:
    """The JSON report of the command line ``args``; a bad image folder is refused before the model is read."""
    files = image_files(args.images, args.count)
    return residual(Detector.from_checkpoint(args.checkpoint, device="cpu"), files, args.extra)


if __name__ == "__main__":
    sys.exit(main())
