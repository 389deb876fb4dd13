"""Re-measure batch padding on every synthetic proxy after the per-level mask fix (resumable).

For each proxy (``configs/proxy/``: the small DETR and the small
Deformable-DETR at 96 px, and the small Deformable-DETR trained at several
sizes as ``configs/study/proxy_multiscale.yaml`` does) and each encoding
(``sine``, ``peg``; seed 0), it trains the model once (a finished run is
reused) and then measures:

* ``detr-peg eval --padding`` with the defaults (batches padded to a multiple
  of the coarsest stride): ``padding.json``;
* with ``--before PATH`` (a checkout of the code before the fix), the same
  command run by that code on the same checkpoint: ``padding_before.json``;
* model level, on the coco128 validation images resized to a short side of
  104 px and a long side of at most 140 px (``--coco128``; sizes that are not
  multiples of the strides, so the canvas of a batch rarely is one either):
  the largest and mean absolute difference of logits and
  boxes between mixed batches and one image at a time, for three ways of
  batching: the canvas of the largest image with the official ``nearest``
  masks (what the code did before), the same canvas with
  ``model.mask_rule=stride``, and the default canvas rounded up to the stride
  multiple: ``outputs_vs_single.json``.

Everything goes into ``--output`` (default ``studies/padding_masks``) and a
``summary.md`` table. The dataset is ``detr-peg demo --data-only``'s
(``outputs/demo/data``, generated when missing).

    python tools/padding_masks_study.py --before /path/to/old/checkout --coco128 ../shared/data/coco128
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from detr_peg.cli.main import OneLineParser  # noqa: E402
from detr_peg.engine.evaluation.metric_units import percent_metrics  # noqa: E402
from detr_peg.errors import UserError  # noqa: E402
from detr_peg.outputs import make_folder  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MULTISCALE = ["data.train_scales=[64,72,80,88,96,104,112,120,128]", "data.train_max_size=128"]
PROXIES = {
    "detr_small": ("configs/proxy/detr_small.yaml", []),
    "deformable_small": ("configs/proxy/deformable_small.yaml", []),
    "deformable_small_multiscale": ("configs/proxy/deformable_small.yaml", MULTISCALE),
}
ENCODINGS = ("sine", "peg")
#: The resize of the model-level comparison: canvases that are not stride multiples.
MODEL_LEVEL_SIZE = ["data.val_scale=104", "data.val_max_size=140"]


def _run(args: list[str], log: Path, env: dict | None = None) -> None:
    with open(log, "a") as out:
        proc = subprocess.run(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(args)}; see {log}")


def _cli(*words: str) -> list[str]:
    return [sys.executable, "-m", "detr_peg.cli.main", *words]


def train(run: Path, config: str, overrides: list[str], data: Path) -> Path:
    """Train once; a run with a finished ``metrics.json`` is reused."""
    if (run / "metrics.json").is_file():
        return run / "checkpoint.pth"
    run.mkdir(parents=True, exist_ok=True)
    # Paths relative to the repository (the commands run there), so the run's config.yaml names no machine.
    data, out = Path(os.path.relpath(data, REPO)), Path(os.path.relpath(run, REPO))
    data_overrides = [
        f"data.train_images={data / 'train'}",
        f"data.train_annotations={data / 'annotations_train.json'}",
        f"data.val_images={data / 'val'}",
        f"data.val_annotations={data / 'annotations_val.json'}",
    ]
    resume = ["--resume"] if (run / "checkpoint.pth").is_file() else []
    _run(_cli("train", "--config", config, "--output", str(out), *resume, *overrides, *data_overrides),
         run / "log.txt")  # fmt: skip
    return run / "checkpoint.pth"


def before_checkpoint(checkpoint: Path) -> Path:
    """A copy of ``checkpoint`` whose config lacks the fields the old code does not know."""
    import torch

    copy = checkpoint.with_name("checkpoint_before.pth")
    if not copy.is_file():
        ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
        ckpt["config"]["model"].pop("mask_rule", None)
        torch.save(ckpt, copy)
    return copy


def evaluate_padding(run: Path, checkpoint: Path, before: Path | None) -> None:
    if not (run / "padding.json").is_file():
        _run(_cli("eval", "--checkpoint", str(checkpoint), "--output", str(run / "eval"), "--padding"), run / "log.txt")
        os.replace(run / "eval" / "padding.json", run / "padding.json")
    if before is not None and not (run / "padding_before.json").is_file():
        old = before_checkpoint(checkpoint)
        env = {**os.environ, "PYTHONPATH": str(before)}
        args = [sys.executable, "-m", "detr_peg.cli.main", "eval", "--checkpoint", str(old),
                "--output", str(run / "eval_before"), "--padding"]  # fmt: skip
        with open(run / "log.txt", "a") as out:
            proc = subprocess.run(args, cwd=before, stdout=out, stderr=subprocess.STDOUT, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"the code at {before} failed; see {run / 'log.txt'}")
        os.replace(run / "eval_before" / "padding.json", run / "padding_before.json")


def outputs_vs_single(run: Path, checkpoint: Path, coco128: Path) -> None:
    """Mixed batches of coco128 images against one image at a time, for three ways of batching."""
    if (run / "outputs_vs_single.json").is_file():
        return
    import torch
    from torchvision import tv_tensors

    from detr_peg.data.image_input import as_rgb_tensor, load_rgb_image
    from detr_peg.data.padding import pad_images
    from detr_peg.data.transforms import build_eval_transforms
    from detr_peg.models.loading import load_model

    loaded = load_model(checkpoint, overrides=MODEL_LEVEL_SIZE)
    model, transform = loaded.model, build_eval_transforms(loaded.config.data)
    names = [i["file_name"] for i in json.loads((coco128 / "annotations_val.json").read_text())["images"]]
    images = [transform(tv_tensors.Image(as_rgb_tensor(load_rgb_image(coco128 / "images" / n)))) for n in names]
    report = {"images": len(images), "sizes": len({tuple(i.shape[-2:]) for i in images}), "resize": MODEL_LEVEL_SIZE}
    with torch.no_grad():
        single = [model(*pad_images([image], model.size_divisibility)) for image in images]
        for name, rule, divisibility in (("official_canvas_nearest", "nearest", 0),
                                         ("official_canvas_stride", "stride", 0),
                                         ("default_rounded_canvas", "nearest", model.size_divisibility)):  # fmt: skip
            model.mask_rule = rule
            diffs = {"logits": [], "boxes": []}
            for start in range(0, len(images), 8):
                batch = images[start : start + 8]
                out = model(*pad_images(batch, divisibility))
                for i in range(len(batch)):
                    alone = single[start + i]
                    diffs["logits"].append((out["pred_logits"][i] - alone["pred_logits"][0]).abs())
                    diffs["boxes"].append((out["pred_boxes"][i] - alone["pred_boxes"][0]).abs())
            report[name] = {
                f"{key}_{stat}": float(getattr(torch.stack(values), stat)())
                for key, values in diffs.items()
                for stat in ("max", "mean")
            }
        model.mask_rule = loaded.config.model.mask_rule
    (run / "outputs_vs_single.json").write_text(json.dumps(report, indent=1) + "\n")


def summary(output: Path) -> str:
    lines = [
        "| proxy | encoding | single | mixed before | mixed now | exact now | boxes vs single: old canvas, "
        "nearest / old canvas, stride / rounded canvas (largest abs) |",
        "|---|---|---|---|---|---|---|",
    ]
    for proxy in PROXIES:
        for encoding in ENCODINGS:
            run = output / f"{proxy}_{encoding}"
            now = _read(run / "padding.json")
            before = _read(run / "padding_before.json")
            outputs = _read(run / "outputs_vs_single.json")

            def ap(report, mode):
                if not report:
                    return "-"
                # padding_before.json of an older checkout holds fractions: read both as percent.
                return f"{percent_metrics(report['modes'][mode]['metrics'], report.get('unit'))['AP']:.1f}"

            boxes = " / ".join(
                f"{outputs[k]['boxes_max']:.3f}" if outputs else "-"
                for k in ("official_canvas_nearest", "official_canvas_stride", "default_rounded_canvas")
            )
            lines.append(
                f"| {proxy} | {encoding} | {ap(now, 'single')} | {ap(before, 'mixed')} | {ap(now, 'mixed')} | "
                f"{ap(now, 'exact')} | {boxes} |"
            )
    return "\n".join(lines) + "\n"


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def proxy_list(text: str) -> list[str]:
    """``--proxies``: names of :data:`PROXIES`, comma-separated, at least one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PROXIES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of the proxies {', '.join(PROXIES)}")
    return names


def main() -> None:
    parser = OneLineParser(
        prog="padding_masks_study.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", type=Path, default=REPO / "studies" / "padding_masks")
    parser.add_argument("--data", type=Path, default=REPO / "outputs" / "demo" / "data")
    # Given paths are taken from the current folder, as usual; the commands below run in the repository.
    parser.add_argument("--before", type=Path, help="a checkout of the code before the fix (optional)")
    parser.add_argument("--coco128", type=Path, help="coco128 folder for the model-level comparison (optional)")
    parser.add_argument("--proxies", type=proxy_list, default=list(PROXIES),
                        help="comma-separated subset of the proxies")  # fmt: skip
    args = parser.parse_args()
    args.output, args.data = args.output.resolve(), args.data.resolve()
    missing = not (args.data / "annotations_val.json").is_file()
    if missing and args.data.name != "data":  # the demo writes OUTPUT/data (and OUTPUT/run): only such a folder is made
        parser.error(f"--data {args.data} holds no demo dataset, and only a folder named data can be made here.")
    try:
        make_folder(args.output)
    except UserError as err:
        parser.error(f"--output: {err}")
    if missing:
        _run(_cli("demo", "--data-only", "--output", str(args.data.parent)), args.output / "demo_log.txt")
    for proxy in args.proxies:
        config, overrides = PROXIES[proxy]
        for encoding in ENCODINGS:
            run = args.output / f"{proxy}_{encoding}"
            print(f"{run.name}: training", flush=True)
            checkpoint = train(run, config, [f"model.position.name={encoding}", "train.seed=0", *overrides], args.data)
            print(f"{run.name}: padding comparison", flush=True)
            evaluate_padding(run, checkpoint, args.before)
            if args.coco128:
                outputs_vs_single(run, checkpoint, args.coco128)
            (args.output / "summary.md").write_text(summary(args.output))
    print(summary(args.output))


if __name__ == "__main__":
    main()
