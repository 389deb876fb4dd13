"""Evaluation runs: a checkpoint and a COCO-format validation set in, metrics and detections out.

Files written into the output folder by the main process:

* ``metrics.json``: ``{"bbox": {"AP": ..., "AP50": ..., ... "ARl": ...},
  "unit": "percent", "num_images": int, "annotations": str, "checkpoint": str,
  ...}``, values in percent (0-100), ``-1`` where COCO defines none (read
  any metrics.json, older ones in fractions too, with
  :func:`~detr_peg.engine.evaluation.metric_units.read_metrics`);
* ``detections.json``: every detection in the COCO results format with the
  dataset's original category ids (see :mod:`detr_peg.engine.evaluation.coco_metrics`).

The table is printed as well. Under ``torchrun`` the images are split over the
processes and gathered for ``COCOeval``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detr_peg.checkpoint.format import Checkpoint, read_checkpoint
from detr_peg.config.schema import Config
from detr_peg.data.coco_dataset import CocoDetection, build_coco_dataset
from detr_peg.data.label_map import LabelMap
from detr_peg.engine.checkpointing import check_output_dir
from detr_peg.engine.distributed import DistEnv, on_main, process_group
from detr_peg.engine.evaluation.coco_metrics import format_metrics_table
from detr_peg.engine.evaluation.evaluate import evaluate_dataset
from detr_peg.engine.evaluation.metric_units import UNIT
from detr_peg.engine.metrics_log import MetricsLog
from detr_peg.engine.mixed_precision import evaluation_amp
from detr_peg.fileio.atomic import write_json
from detr_peg.guards.declared_io import eval_io
from detr_peg.guards.output_guard import Input, guard_outputs
from detr_peg.models.loading import LoadedModel, model_from_checkpoint, resolve_num_classes

METRICS_JSON = "metrics.json"
DETECTIONS_JSON = "detections.json"


@dataclass
class EvalResult:
    """What an evaluation produced.

    Attributes:
        metrics: ``{"AP": ..., "AP50": ..., ...}`` (percent; every process).
        metrics_file: ``metrics.json`` (None outside the main process).
        detections_file: ``detections.json`` (None outside the main process).
        num_images: images evaluated.
        num_detections: detections written.
    """

    metrics: dict[str, float]
    metrics_file: Path | None
    detections_file: Path | None
    num_images: int
    num_detections: int = 0


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
    """Evaluate ``loaded`` on ``dataset``, print the table, write the two JSON files.

    Args:
        loaded: the bare detector, its post-processor and its config (``eval.batch_size``,
            ``eval.padding_mode``, ``data.num_workers``).
        dataset: the validation set (its ``label_map`` maps labels back).
        env: this process.
        output_dir: where the files go.
        log: the main process's log (an ``eval`` record is appended), or None.
        amp: the resolved autocast of the forward pass.
        extra: more entries for ``metrics.json`` and the log record.
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
        return metrics, detections

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
    metrics_file, detections_file = files if files else (None, None)
    return EvalResult(
        metrics=out.metrics,
        metrics_file=metrics_file,
        detections_file=detections_file,
        num_images=out.num_images,
        num_detections=len(out.detections),
    )


def load_for_evaluation(
    cfg: Config, model: Checkpoint | LoadedModel, env: DistEnv
) -> tuple[LoadedModel, CocoDetection, str]:
    """The model on ``env.device`` and the validation set of ``cfg``.

    Args:
        cfg: the config; its ``data`` section names the validation set.
        model: a checkpoint (the model is built from ``cfg`` and given its
            weights) or a model already loaded.
        env: this process.

    Returns:
        ``(loaded, dataset, amp)``: the model (config with ``model.num_classes``
        resolved; label map the model's, else the dataset's), the validation
        set, and the forward pass's autocast resolved for the device (``none``
        on the CPU unless ``train.amp`` is ``auto``).

    Raises:
        UserError: an unfitting checkpoint, bad data, a dataset with more
            classes than the model has.
    """
    if isinstance(model, LoadedModel):
        stored = model.label_map
    else:
        stored = LabelMap.from_dict(model.label_map) if model.label_map else None
    dataset = build_coco_dataset(cfg.data, "val", label_map=stored)
    cfg = resolve_num_classes(
        cfg, dataset.label_map, str(dataset.annotation_file), categories=dataset.coco.dataset["categories"]
    )
    if isinstance(model, LoadedModel):
        loaded = LoadedModel(model.model, model.postprocessor, cfg, dataset.label_map, model.iteration, model.source)
    else:
        loaded = model_from_checkpoint(model, cfg, label_map=dataset.label_map)
    return loaded.to(env.device), dataset, evaluation_amp(cfg.train.amp, env.device)


def run_evaluation(
    cfg: Config,
    checkpoint: str | Path | Checkpoint | LoadedModel,
    output_dir: str | Path,
    *,
    progress_bars: bool | None = None,
    extra_inputs: Sequence[Input] = (),
) -> EvalResult:
    """Evaluate a detr_peg checkpoint on ``cfg.data.val_images`` / ``val_annotations``.

    Args:
        cfg: the config; its ``model`` section must describe the checkpoint's
            model (the command line starts from the config stored in the
            checkpoint).
        checkpoint: a detr_peg checkpoint file (official ones need ``detr-peg
            convert``), one already read, or a model already loaded
            (:meth:`detr_peg.Detector.evaluate` passes its own).
        output_dir: where ``metrics.json`` and ``detections.json`` go.
        progress_bars: show a progress bar; ``None``: when stderr is a terminal.
        extra_inputs: more files the caller read (``--config``), which the
            outputs must not overlap.

    Raises:
        UserError: a missing or unfitting checkpoint, bad data, an unwritable
            output folder.
    """
    with process_group(cfg.train.device) as env, contextlib.ExitStack() as claims:
        path = _source(checkpoint)
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


def _source(checkpoint: str | Path | Checkpoint | LoadedModel) -> str | None:
    """The checkpoint file an evaluation reads (None for a model already loaded)."""
    if isinstance(checkpoint, LoadedModel):
        return checkpoint.source
    return checkpoint.path if isinstance(checkpoint, Checkpoint) else str(checkpoint)


def _open(out: Path, progress_bars: bool | None) -> MetricsLog:
    check_output_dir(out, 0)
    return MetricsLog(out, progress_bars=progress_bars, jsonl=False)
