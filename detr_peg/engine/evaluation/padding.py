"""``eval --padding``: the validation set one image at a time (``single``), in ``mixed`` and in ``exact`` batches.

The effect measured: docs/evaluation.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

import torch
from torch import Tensor

from detr_peg.data.coco_dataset import CocoDetection
from detr_peg.data.padding import further_padding
from detr_peg.engine.distributed import DistEnv, all_gather_objects, broadcast_object
from detr_peg.engine.evaluation.coco_metrics import detections_to_coco, evaluate_coco
from detr_peg.engine.evaluation.evaluate import merge_shards
from detr_peg.engine.evaluation.metric_units import UNIT
from detr_peg.engine.inference import run_inference
from detr_peg.engine.loader import build_eval_loader, image_sizes, iterate_batches
from detr_peg.models.loading import LoadedModel

PADDING_JSON = "padding.json"
#: The runs of :func:`measure_padding`, in the order they are made.
PADDING_RUNS = ("single", "mixed", "exact")
#: Extra padding of every mixed batch (fraction of its height and width) on data of one image size.
EXTRA_PADDING = 0.25


def predict_raw(
    loaded: LoadedModel, loader: Iterable, device: torch.device, amp: str = "none", extra_padding: float = 0.0
) -> tuple[list[tuple[int, list[dict]]], dict[int, tuple[Tensor, Tensor]], float]:
    """``(COCO results per image, {image_id: (pred_logits [Q, K], pred_boxes [Q, 4]) on the CPU}, padded fraction)``."""
    results: list[tuple[int, list[dict]]] = []
    raw: dict[int, tuple[Tensor, Tensor]] = {}
    padded = total = 0
    grow = further_padding(extra_padding, loaded.model.size_divisibility)
    for batch in run_inference(loaded, iterate_batches(loader), device=device, amp=amp, pad=grow):
        padded, total = padded + batch.padded_pixels, total + batch.total_pixels
        for i, (target, det) in enumerate(zip(batch.items, batch.detections)):
            image_id = int(target["image_id"])
            results.append((image_id, detections_to_coco([image_id], [det], loaded.label_map)))
            raw[image_id] = (batch.outputs["pred_logits"][i].cpu(), batch.outputs["pred_boxes"][i].cpu())
    return results, raw, padded / max(total, 1)


def _largest_difference(
    a: dict[int, tuple[Tensor, Tensor]], b: dict[int, tuple[Tensor, Tensor]]
) -> tuple[float, float]:
    logits = max((float((a[i][0] - b[i][0]).abs().max()) for i in a), default=0.0)
    boxes = max((float((a[i][1] - b[i][1]).abs().max()) for i in a), default=0.0)
    return logits, boxes


def measure_padding(
    loaded: LoadedModel,
    dataset: CocoDetection,
    env: DistEnv,
    amp: str = "none",
    *,
    on_run: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Evaluate ``dataset`` in each of :data:`PADDING_RUNS`; returns the content of ``padding.json`` (every process).

    Per mode ``batch_size``, ``metrics`` and ``seconds`` (wall time, data loading included); the largest
    ``max_abs_{logit,box}_diff_<mode>_vs_single`` of raw ``pred_logits`` and normalised cxcywh ``pred_boxes``; on data
    of one image size every ``mixed`` batch grows by ``extra_padding`` (:data:`EXTRA_PADDING`), as a larger image would;
    ``eval.extra_padding``, when set, is the growth on any data.
    """
    cfg = loaded.config
    batch_size = cfg.eval.batch_size
    uniform = len(set(image_sizes(dataset))) == 1
    extra = cfg.eval.extra_padding or (EXTRA_PADDING if uniform else 0.0)
    settings = {"single": (1, "mixed", 0.0), "mixed": (batch_size, "mixed", extra), "exact": (batch_size, "exact", 0.0)}
    modes: dict[str, dict[str, Any]] = {}
    raw: dict[str, dict[int, tuple[Tensor, Tensor]]] = {}
    padded_fraction = 0.0
    # One untimed image first, so the first timed run does not pay for the first call's set-up.
    divisibility = loaded.model.size_divisibility
    first = islice(build_eval_loader(dataset, 1, 0, env, size_divisibility=divisibility), 1)
    predict_raw(loaded, first, env.device, amp)
    for name in PADDING_RUNS:
        size, padding_mode, extra_padding = settings[name]
        start = time.perf_counter()
        loader = build_eval_loader(
            dataset, size, cfg.data.num_workers, env, size_divisibility=divisibility, padding_mode=padding_mode
        )
        results, raw[name], fraction = predict_raw(loaded, loader, env.device, amp, extra_padding)
        if env.device.type == "cuda":
            torch.cuda.synchronize(env.device)
        seconds = time.perf_counter() - start
        shards = all_gather_objects(results)
        metrics = evaluate_coco(dataset.coco, merge_shards(shards)[0]) if env.is_main else {}
        modes[name] = {"batch_size": size, "metrics": broadcast_object(metrics), "seconds": seconds}
        if name == "mixed":
            padded_fraction = fraction
        if on_run is not None:
            on_run(name)
    differences = {}
    for name in ("mixed", "exact"):
        # Each process compares its own shard; the largest difference over all processes is reported.
        local = _largest_difference(raw[name], raw["single"])
        logits, boxes = (max(values) for values in zip(*all_gather_objects(local)))
        differences[f"max_abs_logit_diff_{name}_vs_single"] = logits
        differences[f"max_abs_box_diff_{name}_vs_single"] = boxes
    return {
        "unit": UNIT,
        "modes": {name: modes[name] for name in ("mixed", "single", "exact")},
        **differences,
        "extra_padding": extra,
        "padded_fraction_mixed": padded_fraction,
        "default_mode": "mixed",
    }
