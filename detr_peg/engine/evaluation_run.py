"""Evaluation runs: a checkpoint and a COCO-format validation set in, metrics and detections out.

Files written into the output folder by the main process:

* ``metrics.json``: ``{"bbox": {"AP": ..., "AP50": ..., ... "ARl": ...},
  "num_images": int, "annotations": str, "checkpoint": str, ...}``, values
  as fractions (0..1), ``-1`` where COCO defines none;
* ``detections.json``: every detection in the COCO results format with the
  dataset's original category ids (see :mod:`detr_peg.engine.coco_eval`).

The table is printed as well. Under ``torchrun`` the images are split over the
processes and gathered for ``COCOeval``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch.distributed as dist
from torch import nn

from detr_peg.checkpoint.format import load_weights, read_checkpoint
from detr_peg.config.schema import Config
from detr_peg.data.coco_dataset import CocoDetection, build_coco_dataset
from detr_peg.data.label_map import LabelMap
from detr_peg.engine.checkpointing import check_output_dir
from detr_peg.engine.coco_eval import format_metrics_table
from detr_peg.engine.distributed import DistEnv, init_distributed, shutdown_distributed
from detr_peg.engine.evaluate import evaluate
from detr_peg.engine.loader import build_eval_loader
from detr_peg.engine.metrics_log import MetricsLog
from detr_peg.engine.optim import check_amp
from detr_peg.engine.run_setup import on_main, resolve_num_classes, without_backbone_weights, write_json

METRICS_JSON = "metrics.json"
DETECTIONS_JSON = "detections.json"


@dataclass
class EvalResult:
    """What an evaluation produced.

    Attributes:
        metrics: ``{"AP": ..., "AP50": ..., ...}`` (fractions; every process).
        metrics_file: ``metrics.json`` (None outside the main process).
        detections_file: ``detections.json`` (None outside the main process).
        num_images: images evaluated.
        num_detections: detections written.
    """

    metrics: dict[str, float]
    metrics_file: Optional[Path]
    detections_file: Optional[Path]
    num_images: int
    num_detections: int = 0


def evaluate_and_write(model: nn.Module, postprocessor: nn.Module, dataset: CocoDetection, cfg: Config,
                       env: DistEnv, output_dir: Path, log: Optional[MetricsLog],
                       extra: Optional[dict[str, Any]] = None, amp: Optional[str] = None) -> EvalResult:
    """Evaluate ``model`` on ``dataset``, print the table, write the two JSON files.

    Args:
        model: the bare detector.
        postprocessor: its post-processor.
        dataset: the validation set (its ``label_map`` maps labels back).
        cfg: uses ``eval.batch_size``, ``data.num_workers`` and ``train.amp``.
        env: this process.
        output_dir: where the files go.
        log: the main process's log (an ``eval`` record is appended), or None.
        extra: more entries for ``metrics.json`` and the log record.
        amp: mixed precision for the forward pass (default ``train.amp``).
    """
    extra = dict(extra or {})
    loader = build_eval_loader(dataset, cfg.eval.batch_size, cfg.data.num_workers, env)
    out = evaluate(model, postprocessor, loader, coco_gt=dataset.coco, device=env.device,
                   label_map=dataset.label_map, is_main=env.is_main,
                   amp=cfg.train.amp if amp is None else amp, log=log)

    def write() -> tuple[Path, Path]:
        detections = write_json(output_dir / DETECTIONS_JSON, out.detections, indent=None)
        metrics = write_json(output_dir / METRICS_JSON, {
            "bbox": out.metrics, "num_images": out.num_images, "num_detections": len(out.detections),
            "annotations": str(dataset.annotation_file), **extra})
        return metrics, detections

    files = on_main(env, write)
    if log is not None:
        log.write({"type": "eval", **{k: v for k, v in extra.items() if isinstance(v, (int, float, str))},
                   **out.metrics})
        log.info(format_metrics_table(out.metrics, f"COCO bbox evaluation ({out.num_images} images)"))
    metrics_file, detections_file = files if files else (None, None)
    return EvalResult(metrics=out.metrics, metrics_file=metrics_file, detections_file=detections_file,
                      num_images=out.num_images, num_detections=len(out.detections))


def run_evaluation(cfg: Config, checkpoint: str | Path, output_dir: str | Path, *,
                   progress_bars: Optional[bool] = None) -> EvalResult:
    """Evaluate a detr_peg checkpoint on ``cfg.data.val_images`` / ``val_annotations``.

    Args:
        cfg: the config; its ``model`` section must describe the checkpoint's
            model (the command line starts from the config stored in the
            checkpoint).
        checkpoint: a detr_peg checkpoint (official ones need ``detr-peg convert``).
        output_dir: where ``metrics.json`` and ``detections.json`` go.
        progress_bars: show a progress bar; ``None``: when stderr is a terminal.

    Raises:
        UserError: a missing or unfitting checkpoint, bad data, an unwritable
            output folder.
    """
    owns_group = not (dist.is_available() and dist.is_initialized())
    env = init_distributed(cfg.train.device)
    try:
        ckpt = read_checkpoint(checkpoint)
        stored = LabelMap.from_dict(ckpt.label_map) if ckpt.label_map else None
        dataset = build_coco_dataset(cfg.data, "val", label_map=stored)
        cfg = resolve_num_classes(cfg, dataset.label_map, str(dataset.annotation_file))
        from detr_peg.models.builder import build_model, build_postprocessor

        model = build_model(without_backbone_weights(cfg))
        load_weights(model, ckpt.model, f"Checkpoint {checkpoint}")
        model.to(env.device)
        # Mixed precision only where it exists: a GPU-trained checkpoint evaluates on the CPU in float32.
        amp = cfg.train.amp if env.device.type == "cuda" else "none"
        check_amp(amp, env.device)
        out = Path(output_dir)
        log = on_main(env, lambda: _open(out, progress_bars))
        try:
            return evaluate_and_write(model, build_postprocessor(cfg), dataset, cfg, env, out, log,
                                      extra={"checkpoint": str(checkpoint),
                                             "iteration": ckpt.extra.get("iteration")}, amp=amp)
        finally:
            if log is not None:
                log.close()
    finally:
        if owns_group:
            shutdown_distributed()


def _open(out: Path, progress_bars: Optional[bool]) -> MetricsLog:
    check_output_dir(out, 0)
    return MetricsLog(out, progress_bars=progress_bars, jsonl=False)
