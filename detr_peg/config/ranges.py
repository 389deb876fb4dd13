"""Valid ranges of numeric config fields, and what resource-sized values cost.

Every numeric field of a config dataclass states its range in its field
metadata, made by :func:`valid`::

    num_queries: int = field(default=100, metadata=valid(1, memory=query_memory))

The loader checks each value against its range (that floats are finite, and
that a list marked ``non_empty`` holds an item) before anything is built, and then checks each resource-sized value (one with
a ``memory`` estimate) against the memory of the machine. Both failures are
one line naming the source, the key, the value and the range or the need.

A ``memory`` estimate is a *lower bound* in bytes of what the value forces
the run to allocate: ``memory(get)`` where ``get(key)`` returns a config
value. When the loader checks one key, ``get`` returns that key's own value
and, for every other resource-sized key, the smaller of its value and its
default, so a refused value is refused because of itself (not because another
key is also large) and a config that fits is never refused.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Bytes of one float32 value.
FLOAT = 4

#: ``get(key) -> value`` as given to a memory estimate.
Lookup = Callable[[str], Any]


#: Longest image side (pixels) a test scale or an export may give: one image's feature maps beyond it
#: outgrow a machine's memory.
MAX_TEST_SIDE = 8192

#: Shortest resize target (pixels) a size field or a test scale may give: a resize to 1 x 1 px trips an
#: assertion in torch's antialiased uint8 kernel, and every side of 2 px or more gives images of at least 1 x 2 px.
MIN_IMAGE_SIDE = 2


@dataclass(frozen=True)
class Range:
    """A closed (or right-open) interval of valid numbers.

    Attributes:
        low: smallest valid value (``None``: no lower bound).
        high: largest valid value (``None``: no upper bound).
        high_open: ``high`` itself is not valid (``[0, 1)``).
        low_open: ``low`` itself is not valid (``above 0``).
    """

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
        low, high = _number(self.low), _number(self.high)
        if self.high is None:
            return f"{'above' if self.low_open else 'at least'} {low}"
        if self.low is None:
            return f"{'below' if self.high_open else 'at most'} {high}"
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def _number(x: float | None) -> str:
    """Whole numbers without a fraction or exponent (``2147483647``), others short (``0.1``)."""
    if x is None:
        return ""
    if float(x).is_integer() and abs(x) < 1e16:
        return str(int(x))
    return f"{x:g}"


def valid(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    memory: Callable[[Lookup], float] | None = None,
    non_empty: bool = False,
) -> dict[str, Any]:
    """Field metadata: the valid range, for resource-sized fields the memory estimate, for lists whether one is needed.

    Args:
        low: smallest valid value.
        high: largest valid value.
        low_open: ``low`` itself is not valid.
        high_open: ``high`` itself is not valid.
        memory: ``memory(get) -> bytes``, a lower bound of what the value
            forces a run to allocate (see the module docstring).
        non_empty: a list field whose empty list means nothing (no stage, no
            scale): the loader refuses ``[]`` instead of letting it fall back
            to a default or to nothing.
    """
    return {"range": Range(low, high, high_open, low_open), "memory": memory, "non_empty": non_empty}


def field_range(metadata: Any) -> Range | None:
    """The :class:`Range` in a field's metadata, if any."""
    return metadata.get("range") if metadata else None


def field_non_empty(metadata: Any) -> bool:
    """Whether a list field needs at least one item."""
    return bool(metadata.get("non_empty")) if metadata else False


def field_memory(metadata: Any) -> Callable[[Lookup], float] | None:
    """The memory estimate in a field's metadata, if any."""
    return metadata.get("memory") if metadata else None


def out_of_range(value: Any, rng: Range | None) -> str | None:
    """Why ``value`` (a number or a list of numbers) is not valid, or ``None`` when it is.

    Floats must be finite whether or not the field has a range.
    """
    values = value if isinstance(value, list) else [value]
    for item in values:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            continue
        if isinstance(item, float) and not math.isfinite(item):
            return "a finite number" + (f" {rng.describe()}" if rng is not None else "")
        if rng is not None and item not in rng:
            return rng.describe()
    return None


def machine_memory() -> int:
    """Bytes of physical memory of this machine (the most any one process can hold)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound
        return 1 << 62


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest unit that keeps the number at least 1 (``"1.5 TiB"``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} PiB"


# --------------------------------------------------------- estimates of the shared fields


def _layers(get: Lookup) -> int:
    return get("model.transformer.enc_layers") + get("model.transformer.dec_layers")


def transformer_width_memory(get: Lookup) -> float:
    """Attention weights: four ``d x d`` projections per layer."""
    return FLOAT * 4 * get("model.transformer.hidden_dim") ** 2 * _layers(get)


def feedforward_memory(get: Lookup) -> float:
    """Feed-forward weights: ``d x ff`` twice per layer."""
    return FLOAT * 2 * get("model.transformer.hidden_dim") * get("model.transformer.dim_feedforward") * _layers(get)


def heads_memory(get: Lookup) -> float:
    """One query-by-query attention map per head in the decoder's self-attention."""
    return FLOAT * get("model.transformer.nheads") * get("model.num_queries") ** 2


def query_memory(get: Lookup, key: str = "model.num_queries") -> float:
    """Query embeddings and one ``[Q, d]`` activation per decoder layer."""
    return FLOAT * get(key) * get("model.transformer.hidden_dim") * (get("model.transformer.dec_layers") + 1)


def classes_memory(get: Lookup) -> float:
    """The class head (``d x classes``) and one ``[Q, classes]`` logit map per decoder layer."""
    classes = get("model.num_classes") or 1
    return FLOAT * classes * (get("model.transformer.hidden_dim") + get("model.num_queries"))


def image_memory(get: Lookup, side: int) -> float:
    """A batch of square RGB float images of short side ``side`` (capped by the longest side)."""
    return FLOAT * 3 * get("train.batch_size") * min(side, get("data.train_max_size")) ** 2


def train_scales_memory(get: Lookup) -> float:
    return image_memory(get, max(get("data.train_scales"), default=1))


def crop_memory(get: Lookup) -> float:
    return image_memory(get, min(get("data.crop_size"), default=1))


def val_scale_memory(get: Lookup) -> float:
    return FLOAT * 3 * get("eval.batch_size") * min(get("data.val_scale"), get("data.val_max_size")) ** 2


def batch_memory(get: Lookup) -> float:
    """A training batch of the smallest training scale."""
    return image_memory(get, min(get("data.train_scales"), default=1))


def eval_batch_memory(get: Lookup) -> float:
    return val_scale_memory(get)
