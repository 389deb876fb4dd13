"""Types of command-line options: one ``argparse`` ``type=`` parser per kind of value, shared by every command.
Errors state the valid range; ``nan`` and ``inf`` are refused everywhere.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from detr_peg.config.ranges import MAX_TEST_SIDE


def integer(low: int, high: int | None = None) -> Callable[[str], int]:
    """A whole number in ``[low, high]`` (``high=None``: no upper bound)."""
    valid = f"a whole number from {low} to {high}" if high is not None else f"a whole number of at least {low}"

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {valid}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {valid}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def number(low: float, high: float) -> Callable[[str], float]:
    """A finite number in ``[low, high]``."""
    valid = f"a number from {low:g} to {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {valid}, got {text!r}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {valid}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def scale_list(text: str) -> list[float]:
    """Comma-separated positive finite numbers, each once: ``"1,1.5,2"`` -> ``[1.0, 1.5, 2.0]``."""
    valid = "comma-separated positive numbers such as 1,1.5,2"
    try:
        values = [float(part) for part in text.split(",")]  # an empty part (1,,2 or 1,2,) is no number either
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {valid}, got {text!r}") from None
    if not values or not all(v > 0 and math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"must be {valid}, got {text!r}")
    twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if twice is not None:
        raise argparse.ArgumentTypeError(f"gives the scale {twice:g} twice ({text!r}); give each scale once")
    return values


def device(text: str) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether CUDA is there is checked when the run starts)."""
    value = text.strip().lower()
    if value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit()):
        return value
    raise argparse.ArgumentTypeError(f"must be one of 'auto', 'cpu', 'cuda' or 'cuda:N', got {text!r}")


def config_file(text: str) -> str:
    """The path of a config file or shipped config name; a name that is neither is returned as given."""
    # Imported here so that `detr-peg COMMAND --help` does not load the config machinery.
    from detr_peg.config.shipped import resolve_config

    return str(resolve_config(text)) if text.strip() else text  # empty: refused by the option's action


#: Probabilities and score thresholds.
fraction = number(0.0, 1.0)
#: Counts of one or more (batch sizes, runs).
positive = integer(1)
#: Counts that may be zero.
non_negative = integer(0)


def image_size(text: str) -> tuple[int, int]:
    """``"800x1066"`` -> ``(800, 1066)``: height x width, both from 32 to ``MAX_TEST_SIDE`` (8192)."""
    try:
        height, width = (int(v, 10) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be HEIGHTxWIDTH (for example 800x1066), got {text!r}") from None
    if not (32 <= height <= MAX_TEST_SIDE and 32 <= width <= MAX_TEST_SIDE):
        raise argparse.ArgumentTypeError(
            f"must be HEIGHTxWIDTH with both sides from 32 to {MAX_TEST_SIDE}, got {text!r}"
        )
    return height, width


def key_values(text: str) -> tuple[str, list[str]]:
    """``"model.position.name=sine,peg"`` -> ``("model.position.name", ["sine", "peg"])``: a key and two or more
    values."""
    key, sep, values = text.partition("=")
    options = [v for v in values.split(",") if v]
    if not sep or not key or len(options) < 2:
        raise argparse.ArgumentTypeError(
            f"must be KEY=VALUE1,VALUE2[,...] (for example model.position.name=sine,peg), got {text!r}"
        )
    return key, options
