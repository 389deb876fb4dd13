"""The unit of COCO metrics: percent (0-100), in every table, log line, file and report.

``COCOeval`` computes fractions (0..1); :func:`~detr_peg.engine.evaluation.coco_metrics.evaluate_coco`
turns them into percent once, and everything after it (``metrics.json``,
``metrics.jsonl``, the scale and padding files, ``Detector.evaluate``, the
study's tables and plots) holds percent. The files say so with
``"unit": "percent"``; ``-1`` stays ``-1`` (COCO defines no value, e.g. no
object of that size).

Files written before the unit was recorded hold fractions and have no
``unit`` field. :func:`read_metrics` is the one way to read metrics from a
file or a log record: it returns percent for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The unit of every COCO metric detr_peg writes, and the value of the files' ``"unit"`` field.
UNIT = "percent"
#: The unit of files written without a ``"unit"`` field (fractions 0..1).
LEGACY_UNIT = "fraction"

#: The twelve numbers of ``COCOeval.summarize()`` for bbox evaluation, in its order.
STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")


def to_percent(fraction: float) -> float:
    """A COCO fraction (0..1) in percent; ``-1`` (undefined) stays ``-1``."""
    return -1.0 if fraction < 0 else 100.0 * float(fraction)


def percent_metrics(values: Mapping[str, Any], unit: str | None) -> dict[str, float]:
    """The COCO metrics among ``values`` (other keys are left out), in percent.

    Args:
        values: ``{"AP": ..., "AP50": ..., ...}`` and possibly other entries.
        unit: the unit they were written in: ``"percent"``, or ``None`` /
            ``"fraction"`` for files from before the unit was recorded.
    """
    scale = unit == UNIT
    return {
        name: float(values[name]) if scale else to_percent(values[name])
        for name in STAT_NAMES
        if isinstance(values.get(name), (int, float)) and not isinstance(values.get(name), bool)
    }


def read_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The COCO metrics of a ``metrics.json`` payload or a ``metrics.jsonl`` ``eval`` record, in percent.

    Both the current files (``"unit": "percent"``) and older ones (no unit,
    fractions) are read; a payload's metrics are under ``"bbox"``, a log
    record's at its top level.
    """
    values = record.get("bbox", record)
    return percent_metrics(values if isinstance(values, Mapping) else {}, record.get("unit"))


def format_percent(value: float | None, width: int = 0) -> str:
    """``37.5 %`` (``n/a`` for undefined or missing values), right-aligned in ``width`` characters."""
    text = "n/a" if value is None or value < 0 else f"{value:.1f} %"
    return f"{text:>{width}}"
