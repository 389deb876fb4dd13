"""What each command reads and writes, declared in one place for :func:`~detr_peg.guards.output_guard.guard_outputs`.
A new command, or a new file written by an existing one, is declared here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from detr_peg.config.schema import Config, DataConfig
from detr_peg.guards.output_guard import OWNERSHIP_FILE, Input, Output

RUN_NAMES = ("checkpoint.pth", "config.yaml", "metrics.jsonl", "metrics.json", "detections.json")
EVAL_NAMES = ("metrics.json", "detections.json", "scales_resized.json", "scales_canvas.json", "padding.json")
PREDICTIONS_NAME = "predictions.json"
#: What ``demo --output DIR`` writes: the folders, and the synthetic dataset inside ``DIR/data``.
DEMO_NAMES = ("data", "run", "predictions")
#: What ``study --output DIR`` writes into ``DIR`` (each cell is a training run and an evaluation inside ``cells/``).
PLAN_NAME = "plan.json"
STUDY_NAMES = (PLAN_NAME, "cells", "jobs", "plots", "study.json", "study.csv", "cells.csv", "study.md")
#: What ``plot`` writes: a study's tables and figures, or a training run's learning curve.
STUDY_TABLE_NAMES = ("study.json", "study.csv", "cells.csv", "study.md", "plots")
STUDY_PLOT_NAMES = tuple(
    f"{name}.{fmt}"
    for name in ("comparisons", "ap_vs_scale", "learning_curves", "main_metrics")
    for fmt in ("pdf", "png")
)
RUN_PLOT_NAMES = ("learning_curve.pdf", "learning_curve.png")
DEMO_DATA_NAMES = ("annotations_train.json", "annotations_val.json", "manifest.json", "train", "val")

IO = tuple[list[Input], list[Output]]


def _local(spec: str | None) -> bool:
    return bool(spec) and not str(spec).startswith(("http://", "https://", "torchvision://", "timm://"))


def _inputs(pairs: Iterable[tuple[str | os.PathLike | None, str]]) -> list[Input]:
    return [Input(Path(path), option) for path, option in pairs if path and _local(str(path))]


def data_inputs(data: DataConfig, splits: Sequence[str] = ("train", "val")) -> list[Input]:
    """The image folders and annotation files of ``data`` for ``splits``."""
    pairs = []
    for split in splits:
        pairs += [
            (getattr(data, f"{split}_images"), f"data.{split}_images"),
            (getattr(data, f"{split}_annotations"), f"data.{split}_annotations"),
        ]
    return _inputs(pairs)


def train_io(
    data: DataConfig,
    output_dir: str,
    *,
    init_from: str | None,
    backbone_weights: str | None,
    tensorboard: bool,
    resume: bool,
) -> IO:
    """A training run: the data, ``train.init_from`` and backbone weights in; the run folder out."""
    inputs = data_inputs(data) + _inputs([(init_from, "train.init_from"), (backbone_weights, "model.backbone.weights")])
    names = RUN_NAMES + (("tensorboard",) if tensorboard else ())
    return inputs, [Output(Path(output_dir), "train.output_dir", names, adopt=resume)]


def eval_io(
    cfg: Config, checkpoint: str | os.PathLike, output_dir: str | os.PathLike, extra_inputs: Sequence[Input] = ()
) -> IO:
    """An evaluation: the checkpoint and the validation data in; the two JSON files out."""
    inputs = [*data_inputs(cfg.data, ("val",)), *_inputs([(checkpoint, "--checkpoint")]), *extra_inputs]
    return inputs, [Output(Path(output_dir), "--output", EVAL_NAMES)]


def predict_io(
    paths: Sequence[str | os.PathLike],
    model_file: str,
    output_dir: str | os.PathLike,
    png_names: Sequence[str],
    model_option: str = "--checkpoint",
) -> IO:
    """Prediction: images, folders and the model (checkpoint or ONNX graph) in; ``predictions.json`` and PNGs out."""
    inputs = _inputs([(p, "INPUT") for p in paths] + [(model_file, model_option)])
    return inputs, [Output(Path(output_dir), "--output", (PREDICTIONS_NAME, *png_names))]


def convert_io(src: str, dst: str, config_file: str | None) -> IO:
    """Conversion: the official checkpoint (and config) in; one checkpoint file out."""
    return _inputs([(src, "SRC"), (config_file, "--config")]), [Output(Path(dst), "DST")]


def demo_io(output_dir: str | os.PathLike, config_file: str | os.PathLike | None) -> IO:
    """The demo: its config in; the output folder, its synthetic dataset and its pictures out."""
    out = Path(output_dir)
    # The folders inside first, so a refusal names the file of the user's rather than its folder.
    outputs = [
        Output(out / "data", "--output", DEMO_DATA_NAMES),
        Output(out / "run", "--output", RUN_NAMES, kind="train"),
        Output(out / "predictions", "--output", (PREDICTIONS_NAME,)),
        Output(out, "--output", DEMO_NAMES),
    ]
    return _inputs([(config_file, "--config")]), outputs


def bench_io(output_file: str | os.PathLike, config_file: str | None) -> IO:
    """The benchmark: its config in; the JSON report out."""
    return _inputs([(config_file, "--config")]), [Output(Path(output_file), "--output")]


def export_io(checkpoint: str | os.PathLike, output_file: str | os.PathLike) -> IO:
    """ONNX export: the checkpoint in; one ``.onnx`` file out."""
    return _inputs([(checkpoint, "--checkpoint")]), [Output(Path(output_file), "--output")]


def study_io(
    study_dir: str | os.PathLike, config_files: Sequence[str | os.PathLike], study_file: str | os.PathLike | None
) -> IO:
    """A study: its study file and base configs in; the study folder out (adopted when it holds ``plan.json``)."""
    out = Path(study_dir)
    inputs = _inputs([(study_file, "--study"), *((c, "--config") for c in config_files)])
    ours = (out / PLAN_NAME).is_file()
    return inputs, [
        Output(out / "plots", "--output", STUDY_PLOT_NAMES, kind="study", adopt=ours),
        Output(out, "--output", STUDY_NAMES, adopt=ours),
    ]


def publish_io(study_dir: str | os.PathLike, dest: str | os.PathLike) -> IO:
    """``plot STUDY --publish DEST``: the study in; the copy out (adopted when it holds ``plan.json``)."""
    out = Path(dest)
    ours = (out / PLAN_NAME).is_file()
    return _inputs([(study_dir, "RUN_OR_STUDY")]), [
        Output(out, "--publish", (PLAN_NAME, "cells", *STUDY_TABLE_NAMES), kind="study", adopt=ours),
        Output(out / "plots", "--publish", STUDY_PLOT_NAMES, kind="study", adopt=ours),
    ]


def plot_io(folder: str | os.PathLike, study: bool) -> IO:
    """Figures: the tables and ``plots/`` of a study folder, or ``plots/`` of a run folder.

    A folder without an ownership file (written before ownership was recorded) is adopted.
    """
    root = Path(folder)
    kind = "study" if study else "train"
    legacy = not os.path.lexists(root / OWNERSHIP_FILE)
    names, pictures = (STUDY_TABLE_NAMES, STUDY_PLOT_NAMES) if study else (("plots",), RUN_PLOT_NAMES)
    outputs = [
        Output(root / "plots", "RUN_OR_STUDY", pictures, kind=kind, adopt=legacy),
        Output(root, "RUN_OR_STUDY", names, kind=kind, adopt=legacy),
    ]
    return [], outputs
