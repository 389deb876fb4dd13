"""Tiny, fast training configurations and data subsets shared by the engine and CLI tests.

The model is a ResNet-18 cut after stage 3 (trainable BatchNorm, nothing
frozen) with a one-layer, 32-wide transformer and a handful of queries; the
images are resized to under 100 pixels. A training iteration takes a fraction
of a second on one CPU core.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from detr_peg.config import Config, load_config
from detr_peg.data.synthetic import SyntheticCoco, generate_synthetic_coco

TINY_MODEL = [
    "model.backbone.name=resnet18",
    "model.backbone.weights=null",
    "model.backbone.norm=bn",
    "model.backbone.frozen_stages=0",
    "model.backbone.out_stages=[3]",
    "model.transformer.hidden_dim=32",
    "model.transformer.nheads=2",
    "model.transformer.enc_layers=1",
    "model.transformer.dec_layers=1",
    "model.transformer.dim_feedforward=64",
    "model.num_queries=8",
]

SMALL_IMAGES = [
    "data.train_scales=[64]",
    "data.train_max_size=96",
    "data.crop_scales=[64]",
    "data.crop_size=[48,64]",
    "data.val_scale=64",
    "data.val_max_size=96",
]

RUN = ["train.device=cpu", "train.log_every=1", "data.num_workers=0", "eval.batch_size=4"]


def synthetic_data(root: Path, num_train: int = 8, num_val: int = 4) -> SyntheticCoco:
    """A small synthetic shapes dataset (64 px square images)."""
    return generate_synthetic_coco(
        root,
        num_train=num_train,
        num_val=num_val,
        image_size=64,
        max_objects=3,
        seed=3,
        color_by_class=True,
        progress=False,
    )


def data_overrides(
    train_images: Path | str,
    train_annotations: Path | str,
    val_images: Path | str | None = None,
    val_annotations: Path | str | None = None,
) -> list[str]:
    out = [f"data.train_images={train_images}", f"data.train_annotations={train_annotations}"]
    if val_images is not None:
        out += [f"data.val_images={val_images}", f"data.val_annotations={val_annotations}"]
    return out


def synthetic_overrides(data: SyntheticCoco, output_dir: Path, *extra: str) -> list[str]:
    """Overrides of a tiny run on ``data`` writing to ``output_dir``."""
    return [
        *TINY_MODEL,
        *SMALL_IMAGES,
        *RUN,
        *data_overrides(data.train_images, data.train_annotations, data.val_images, data.val_annotations),
        f"train.output_dir={output_dir}",
        *extra,
    ]


def tiny_config(overrides: Sequence[str]) -> Config:
    return load_config(None, list(overrides))


def write_subset(annotation_file: Path, image_ids: Sequence[int], out: Path) -> Path:
    """A COCO annotation file with only ``image_ids`` (all categories kept)."""
    data = json.loads(Path(annotation_file).read_text())
    keep = set(image_ids)
    data["images"] = [img for img in data["images"] if img["id"] in keep]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in keep]
    out.write_text(json.dumps(data))
    return out


def logged_iterations(metrics: Path) -> list[int]:
    """Iterations logged so far in a run's ``metrics.jsonl`` (a line still being written is skipped)."""
    if not metrics.is_file():
        return []
    out = []
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line being written
            continue
        if record.get("type") == "iter":
            out.append(record["iteration"])
    return out


def wait_for_iteration(
    metrics: Path,
    above: int,
    *,
    ended: Callable[[], object],
    kill: Callable[[], None],
    timeout: float = 120,
    interval: float = 0.01,
    since: int = 0,
) -> int:
    """Wait until a running training logs an iteration after ``above``; return the latest one logged.

    Args:
        since: iteration records to pass over first (those of earlier, killed processes: a resumed run appends,
            and a process killed between logging an iteration and writing its checkpoint logged one it repeats).
        ended: falsy while the process runs, else a description of how it ended.
        kill: stops the process when no iteration came within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [i for i in logged_iterations(metrics)[since:] if i > above]
        if done:
            return max(done)
        end = ended()
        assert not end, f"training ended early: {end}"
        time.sleep(interval)
    kill()
    raise AssertionError(f"no iteration after {above} within {timeout} s")
