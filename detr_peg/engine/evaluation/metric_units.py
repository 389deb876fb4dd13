"""COCO metrics are percent (0-100) everywhere after ``evaluate_coco``; ``-1`` stays ``-1`` (undefined).

Files say ``"unit": "percent"``; older files without ``unit`` hold fractions, which :func:`read_metrics` converts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from detr_peg.config.ranges import is_number

#: The unit of every COCO metric detr_peg writes, and the value of the files' ``"unit"`` field.
UNIT = "percent"

#: The twelve numbers of ``COCOeval.summarize()`` for bbox evaluation, in its order.
STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")


def to_percent(fraction: float) -> float:
    """A COCO fraction (0..1) in percent; ``-1`` (undefined) stays ``-1``."""
    return -1.0 if fraction < 0 else 100.0 * float(fraction)


def percent_metrics(values: Mapping[str, Any], unit: str | None) -> dict[str, float]:
    """The :data:`STAT_NAMES` entries of ``values`` in percent; ``unit`` None or ``"fraction"`` means values in 0..1.

    Raises ValueError for another unit, or a fraction above 1 (a file in percent without its unit).
    """
    if unit not in (None, "fraction", UNIT):
        raise ValueError(f"its 'unit' is {unit!r}, not 'percent' (or 'fraction')")
    found = {name: float(values[name]) for name in STAT_NAMES if is_number(values.get(name), finite=False)}
    above = [name for name, value in found.items() if value > 1]
    if unit != UNIT and above:
        raise ValueError(
            f"'{above[0]}' is {found[above[0]]:g}, above 1 for a fraction; percent needs 'unit': 'percent'"
        )
    return {name: value if unit == UNIT else to_percent(value) for name, value in found.items()}


def read_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The COCO metrics (percent) of a ``metrics.json`` payload (under ``"bbox"``) or an ``eval`` log record."""
    values = record.get("bbox", record)
    return percent_metrics(values if isinstance(values, Mapping) else {}, record.get("unit"))


def format_percent(value: float | None, width: int = 0) -> str:
    """``37.5 %`` (``n/a`` for undefined or missing values), right-aligned in ``width`` characters."""
    text = "n/a" if value is None or value < 0 else f"{value:.1f} %"
    return f"{text:>{width}}"
