"""COCO evaluation over a sharded loader: results gathered to the main process, repeats dropped by image id."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from pycocotools.coco import COCO

from detr_peg.data.coco_dataset import CocoDetection
from detr_peg.data.label_map import LabelMap
from detr_peg.data.padding import further_padding
from detr_peg.engine.distributed import DistEnv, all_gather_objects, broadcast_object
from detr_peg.engine.evaluation.coco_metrics import coco_stats, detections_to_coco, run_cocoeval
from detr_peg.engine.evaluation.per_class import per_class_ap
from detr_peg.engine.inference import run_inference
from detr_peg.engine.loader import build_eval_loader, iterate_batches
from detr_peg.engine.metrics_log import MetricsLog
from detr_peg.errors import UserError
from detr_peg.models.loading import LoadedModel

#: Without a progress bar (output not to a terminal), a line of progress at most this often.
LINE_SECONDS = 30


@dataclass
class EvalOutput:
    """What :func:`evaluate` returns: ``metrics`` (percent) in every process, ``detections`` in the main one only."""

    metrics: dict[str, float]
    detections: list[dict] = field(default_factory=list)
    num_images: int = 0
    per_class: list[dict] = field(default_factory=list)  # see per_class.per_class_ap; main process only


def predict_coco(
    loaded: LoadedModel,
    loader: Iterable,
    *,
    device: torch.device,
    label_map: LabelMap,
    amp: str = "none",
    log: MetricsLog | None = None,
    extra_padding: float = 0.0,
) -> list[tuple[int, list[dict]]]:
    """This process's ``(image_id, COCO results of that image)`` in loader order.

    ``loaded`` is the bare detector (not DDP); ``extra_padding`` grows every batch by that fraction of its size.
    """
    out: list[tuple[int, list[dict]]] = []
    total = len(loader) if hasattr(loader, "__len__") else 0
    bar = log.progress(total=total, desc="eval") if log is not None else None
    done, shown = 0, time.monotonic()

    def step(_: object) -> None:  # the bar on a terminal, else a line now and then
        nonlocal done, shown
        done += 1
        log.step(bar)
        if done == total or time.monotonic() - shown >= LINE_SECONDS:
            log.line(f"eval: {done}/{total} batches")
            shown = time.monotonic()

    if log is not None:
        log.line(f"eval: {total} batches")
    try:
        for batch in run_inference(
            loaded,
            iterate_batches(loader),
            device=device,
            amp=amp,
            on_batch=step if log is not None else None,
            pad=further_padding(extra_padding, loaded.model.size_divisibility),
        ):
            for target, det in zip(batch.items, batch.detections):
                image_id = int(target["image_id"])
                out.append((image_id, detections_to_coco([image_id], [det], label_map)))
    finally:
        if log is not None:
            log.close_bar()
    return out


def merge_shards(shards: list[list[tuple[int, list[dict]]]]) -> tuple[list[dict], int]:
    """``(results sorted by image id, number of distinct images)``, keeping each image id's first occurrence."""
    per_image: dict[int, list[dict]] = {}
    for shard in shards:
        for image_id, results in shard:
            per_image.setdefault(image_id, results)
    merged = [r for image_id in sorted(per_image) for r in per_image[image_id]]
    return merged, len(per_image)


def evaluate(
    loaded: LoadedModel,
    loader: Iterable,
    *,
    coco_gt: COCO,
    device: torch.device,
    label_map: LabelMap,
    is_main: bool = True,
    amp: str = "none",
    log: MetricsLog | None = None,
    extra_padding: float = 0.0,
) -> EvalOutput:
    """COCO bbox metrics of ``loaded`` over every process's shard; the ``is_main`` process runs ``COCOeval``.

    Every image of ``coco_gt`` counts, so images a skipped sample left out count as misses.
    """
    local: list[tuple[int, list[dict]]] = []
    error: UserError | None = None
    try:
        local = predict_coco(
            loaded, loader, device=device, label_map=label_map, amp=amp, log=log, extra_padding=extra_padding
        )
    except UserError as exc:  # non-finite outputs, a bad image: every process must learn of it, or the rest wait
        error = exc
    gathered = all_gather_objects((local, None if error is None else str(error)))
    problems = [problem for _, problem in gathered if problem is not None]
    if problems:
        raise error if error is not None else UserError(f"Another process stopped: {problems[0]}")
    shards = [shard for shard, _ in gathered]
    if is_main:
        detections, num_images = merge_shards(shards)
        evaluator = run_cocoeval(coco_gt, detections)
        metrics = coco_stats(evaluator)
        per_class = per_class_ap(evaluator) if evaluator is not None else []
    else:
        detections, num_images, metrics, per_class = [], 0, {}, []
    metrics, num_images = broadcast_object((metrics, num_images))
    return EvalOutput(metrics, detections, num_images, per_class)


def evaluate_dataset(
    loaded: LoadedModel,
    dataset: CocoDetection,
    env: DistEnv,
    *,
    amp: str,
    log: MetricsLog | None = None,
) -> EvalOutput:
    """:func:`evaluate` on a validation set, batched as ``eval.batch_size``, ``padding_mode``, ``extra_padding`` say."""
    cfg = loaded.config
    loader = build_eval_loader(
        dataset,
        cfg.eval.batch_size,
        cfg.data.num_workers,
        env,
        size_divisibility=loaded.model.size_divisibility,
        padding_mode=cfg.eval.padding_mode,
    )
    return evaluate(
        loaded,
        loader,
        coco_gt=dataset.coco,
        device=env.device,
        label_map=dataset.label_map,
        is_main=env.is_main,
        amp=amp,
        log=log,
        extra_padding=cfg.eval.extra_padding,
    )
