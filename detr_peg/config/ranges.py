"""Valid ranges of numeric config fields, stated in each field's metadata by :func:`valid` and checked by the
loader (Rule "Config values" of docs/guarantees.md). Upper bounds keep a value to what a machine can hold; a run
that still cannot allocate what it needs ends in one line (``detr_peg.cli.main.out_of_memory``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Literal

#: Longest image side (pixels) a test scale or an export may give: one image's feature maps beyond it
#: outgrow a machine's memory.
MAX_TEST_SIDE = 8192

#: Shortest resize target (pixels) a size field or a test scale may give: a resize to 1 x 1 px trips an
#: assertion in torch's antialiased uint8 kernel, and every side of 2 px or more gives images of at least 1 x 2 px.
MIN_IMAGE_SIDE = 2

#: Most classes a model may have, from the config or from the categories of its data.
MAX_CLASSES = 100_000


def is_whole(value: Any) -> bool:  # NumPy's integers too; Python's True is 1, never a count a user meant
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any, finite: bool = True) -> bool:  # any real number (NumPy's too), not bool
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and (not finite or math.isfinite(value))


@dataclass(frozen=True)
class Range:
    """An interval of valid numbers; ``None``: unbounded on that side; ``*_open``: the bound itself is invalid."""

    low: float | None = None
    high: float | None = None
    high_open: bool = False
    low_open: bool = False

    def __contains__(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return False
        return True

    def describe(self) -> str:
        """``"at least 1"``, ``"above 0"``, ``"at most 1"`` or ``"in [0, 1)"``."""
        low, high = (
            "" if x is None else str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"
            for x in (self.low, self.high)
        )
        if self.high is None:
            return f"{'above' if self.low_open else 'at least'} {low}"
        if self.low is None:
            return f"{'below' if self.high_open else 'at most'} {high}"
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def valid(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    non_empty: bool = False,
    order: Literal["ascending", "min_max"] | None = None,
    pattern: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """Field metadata: the range; ``non_empty`` refuses ``[]``; ``order``: a list ascending (no repeats) or [min, max];
    ``pattern``: (regular expression a string must match, how messages describe it)."""
    return {"range": Range(low, high, high_open, low_open), "non_empty": non_empty, "order": order, "pattern": pattern}


def out_of_range(value: Any, rng: Range | None) -> str | None:
    """Why ``value`` (a number or a list of numbers) is not valid, or ``None`` when it is.

    Floats must be finite whether or not the field has a range.
    """
    values = value if isinstance(value, list) else [value]
    for item in values:
        if not is_number(item, finite=False):
            continue
        if isinstance(item, float) and not math.isfinite(item):
            return "a finite number" + (f" {rng.describe()}" if rng is not None else "")
        if rng is not None and item not in rng:
            return rng.describe()
    return None
