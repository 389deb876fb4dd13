"""Evaluation runs: a checkpoint and a COCO validation set in, ``metrics.json`` and ``detections.json`` out.

``metrics.json``: ``{"bbox": {"AP": ..., ...}, "unit": "percent", "num_images", "num_detections", "annotations", ...}``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from detr_peg.checkpoint.format import Checkpoint, read_checkpoint
from detr_peg.config.loader import checked_config
from detr_peg.config.schema import Config
from detr_peg.data.coco_dataset import CocoDetection, build_coco_dataset
from detr_peg.data.label_map import LabelMap
from detr_peg.engine.checkpointing import check_output_dir
from detr_peg.engine.distributed import DistEnv, on_main, process_group
from detr_peg.engine.evaluation.coco_metrics import format_metrics_table
from detr_peg.engine.evaluation.evaluate import evaluate_dataset
from detr_peg.engine.evaluation.metric_units import UNIT
from detr_peg.engine.evaluation.per_class import CONFUSION_JSON, PER_CLASS_CSV, confusion_matrix, per_class_csv
from detr_peg.engine.metrics_log import MetricsLog
from detr_peg.engine.mixed_precision import evaluation_amp
from detr_peg.models.builder import torch_defaults
from detr_peg.models.loading import LoadedModel, model_from_checkpoint, resolve_num_classes
from detr_peg.outputs import Input, Output, atomic_write_text, guard_outputs, inputs, write_json

METRICS_JSON = "metrics.json"
DETECTIONS_JSON = "detections.json"


@dataclass
class EvalResult:
    """What an evaluation produced: ``metrics`` (percent) in every process, the files in the main one (else None)."""

    metrics: dict[str, float]
    metrics_file: Path | None
    detections_file: Path | None
    num_images: int
    num_detections: int = 0
    #: Rows of ``per_class.csv`` and the content of ``confusion_matrix.json`` (main process; see evaluation.per_class).
    per_class: list[dict] = field(default_factory=list)
    confusion: dict | None = None


def evaluate_and_write(
    loaded: LoadedModel,
    dataset: CocoDetection,
    env: DistEnv,
    output_dir: Path,
    log: MetricsLog | None,
    *,
    amp: str,
    extra: dict[str, Any] | None = None,
) -> EvalResult:
    """Evaluate ``loaded`` on ``dataset``, log the table and an ``eval`` record, and write the two JSON files.

    ``extra`` adds entries to ``metrics.json`` and to the record.
    """
    extra = dict(extra or {})
    out = evaluate_dataset(loaded, dataset, env, amp=amp, log=log)

    def write() -> tuple[Path, Path]:
        detections = write_json(output_dir / DETECTIONS_JSON, out.detections, indent=None)
        metrics = write_json(
            output_dir / METRICS_JSON,
            {
                "bbox": out.metrics,
                "unit": UNIT,
                "num_images": out.num_images,
                "num_detections": len(out.detections),
                "annotations": str(dataset.annotation_file),
                **extra,
            },
        )
        atomic_write_text(output_dir / PER_CLASS_CSV, per_class_csv(out.per_class))
        confusion = confusion_matrix(dataset.coco, out.detections)  # only where it is written
        write_json(output_dir / CONFUSION_JSON, confusion, indent=None)
        return metrics, detections, confusion

    files = on_main(env, write)
    if log is not None:
        log.write(
            {
                "type": "eval",
                **{k: v for k, v in extra.items() if isinstance(v, (int, float, str))},
                **out.metrics,
                "unit": UNIT,
            }
        )
        log.info(format_metrics_table(out.metrics, f"COCO bbox evaluation ({out.num_images} images)"))
    metrics_file, detections_file, confusion = files if files else (None, None, None)
    return EvalResult(
        metrics=out.metrics,
        metrics_file=metrics_file,
        detections_file=detections_file,
        num_images=out.num_images,
        num_detections=len(out.detections),
        per_class=out.per_class,
        confusion=confusion,
    )


def load_for_evaluation(
    cfg: Config, model: Checkpoint | LoadedModel, env: DistEnv
) -> tuple[LoadedModel, CocoDetection, str]:
    """``(model on env.device, validation set, resolved autocast)`` of ``cfg``; UserError if they do not fit."""
    if isinstance(model, LoadedModel):
        stored = model.label_map
    else:
        stored = LabelMap.from_dict(model.label_map) if model.label_map else None
    dataset = build_coco_dataset(cfg.data, "val", label_map=stored)
    model_cfg = resolve_num_classes(
        cfg.model, dataset.label_map, str(dataset.annotation_file), categories=dataset.coco.dataset["categories"]
    )
    cfg = replace(cfg, model=model_cfg)
    if isinstance(model, LoadedModel):
        loaded = LoadedModel(model.model, model.postprocessor, cfg, dataset.label_map, model.iteration, model.source)
    else:
        loaded = model_from_checkpoint(model, cfg, label_map=dataset.label_map)
    return loaded.to(env.device), dataset, evaluation_amp(cfg.train.amp, env.device)


@torch_defaults()  # float32 and the CPU as torch's defaults, whatever the caller set
def run_evaluation(
    cfg: Config,
    checkpoint: str | Path | Checkpoint | LoadedModel,
    output_dir: str | Path,
    *,
    progress_bars: bool | None = None,
    extra_inputs: Sequence[Input] = (),
) -> EvalResult:
    """Evaluate a checkpoint (file, read or loaded model) on ``cfg.data.val_images`` / ``val_annotations``.

    ``cfg.model`` must describe the checkpoint's model; official checkpoints need ``detr-peg convert``.
    ``extra_inputs`` are other files the caller read (``--config``), which the outputs must not overlap.

    Raises:
        UserError: a missing or unfitting checkpoint, bad data, an unwritable output folder.
    """
    cfg = checked_config(cfg)  # it may have been edited in Python
    with process_group(cfg.train.device) as env, contextlib.ExitStack() as claims:
        path = source_of(checkpoint)
        owned = on_main(env, lambda: guard_outputs("eval", *eval_io(cfg, path, output_dir, extra_inputs)))
        if owned is not None:
            claims.enter_context(owned)  # settled when the evaluation ends, well or not
        if not isinstance(checkpoint, (Checkpoint, LoadedModel)):
            checkpoint = read_checkpoint(path)
        loaded, dataset, amp = load_for_evaluation(cfg, checkpoint, env)
        out = Path(output_dir)
        log = on_main(env, lambda: _open(out, progress_bars))
        try:
            return evaluate_and_write(
                loaded, dataset, env, out, log, amp=amp, extra={"checkpoint": path, "iteration": loaded.iteration}
            )
        finally:
            if log is not None:
                log.close()


def source_of(checkpoint: str | Path | Checkpoint | LoadedModel) -> str | None:
    """The checkpoint file an evaluation reads (None for a model already loaded)."""
    if isinstance(checkpoint, LoadedModel):
        return checkpoint.source
    return checkpoint.path if isinstance(checkpoint, Checkpoint) else str(checkpoint)


def _open(out: Path, progress_bars: bool | None) -> MetricsLog:
    check_output_dir(out, 0)
    return MetricsLog(out, progress_bars=progress_bars, jsonl=False)


#: What an evaluation writes into its output folder.
EVAL_NAMES = ("metrics.json", "detections.json", PER_CLASS_CSV, CONFUSION_JSON, "scales_resized.json",
              "scales_canvas.json", "padding.json")  # fmt: skip


def eval_io(cfg: Config, checkpoint: object, output_dir: str | Path, extra_inputs: Sequence[Input] = ()) -> tuple:
    """The checkpoint and the validation data in; the evaluation's files out."""
    reads = [*inputs(*cfg.data.files(("val",)), (checkpoint, "--checkpoint")), *extra_inputs]
    return reads, [Output(output_dir, "--output", EVAL_NAMES)]
