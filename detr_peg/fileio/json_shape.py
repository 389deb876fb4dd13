"""The shape of a JSON file detr_peg wrote, checked when read back, so damage is one sentence naming the file,
field and value, never a ``KeyError`` deep in the code.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from detr_peg.errors import UserError
from detr_peg.fileio.bounded_read import parse_json, read_bounded_bytes
from detr_peg.messages import shortened


class ShapeError(Exception):
    """A value that does not have its declared shape: ``where`` (``definition.seeds``) and what is wrong."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where or 'the file'} {problem}")
        self.where, self.problem = where, problem


def _shown(value: Any) -> str:
    text = json.dumps(value, allow_nan=True) if not isinstance(value, (dict, list)) else type(value).__name__
    text = {"dict": "an object", "list": "a list"}.get(text, text)
    return shortened(text)


def _at(where: str, key: str | int) -> str:
    return f"{where}[{key}]" if isinstance(key, int) else (f"{where}.{key}" if where else key)


class Shape:
    """A declared shape; :meth:`check` raises :class:`ShapeError` for a value that does not have it."""

    def check(self, value: Any, where: str) -> None:  # pragma: no cover - every shape overrides it
        raise NotImplementedError


@dataclass(frozen=True)
class Number(Shape):
    """A finite number (not a boolean), above ``above`` when given."""

    above: float | None = None

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ShapeError(where, f"is {_shown(value)}, not a number")
        if not math.isfinite(value):
            raise ShapeError(where, f"is {_shown(value)}, not a finite number")
        if self.above is not None and value <= self.above:
            raise ShapeError(where, f"is {_shown(value)}, not above {self.above:g}")


@dataclass(frozen=True)
class Integer(Shape):
    """A whole number (not a boolean), from ``minimum`` to ``maximum`` when given."""

    minimum: int | None = None
    maximum: int | None = None

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ShapeError(where, f"is {_shown(value)}, not a whole number")
        if self.minimum is not None and value < self.minimum:
            raise ShapeError(where, f"is {_shown(value)}, less than {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise ShapeError(where, f"is {_shown(value)}, more than {self.maximum:,}")


@dataclass(frozen=True)
class Text(Shape):
    """A string, one of ``choices`` when given."""

    choices: tuple[str, ...] = ()

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, str):
            raise ShapeError(where, f"is {_shown(value)}, not a string")
        if self.choices and value not in self.choices:
            raise ShapeError(where, f"is {_shown(value)}, not one of {', '.join(self.choices)}")


@dataclass(frozen=True)
class Flag(Shape):
    """``true`` or ``false``."""

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, bool):
            raise ShapeError(where, f"is {_shown(value)}, not true or false")


@dataclass(frozen=True)
class Anything(Shape):
    """Any value (a field that is kept, not read)."""

    def check(self, value: Any, where: str) -> None:
        return None


@dataclass(frozen=True)
class Nullable(Shape):
    """``null`` or a value of ``shape``."""

    shape: Shape

    def check(self, value: Any, where: str) -> None:
        if value is not None:
            self.shape.check(value, where)


@dataclass(frozen=True)
class ListOf(Shape):
    """A list of at least ``min_length`` values of ``shape``."""

    shape: Shape
    min_length: int = 0

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, list):
            raise ShapeError(where, f"is {_shown(value)}, not a list")
        if len(value) < self.min_length:
            raise ShapeError(where, f"has {len(value)} values, fewer than {self.min_length}")
        for index, item in enumerate(value):
            self.shape.check(item, _at(where, index))


@dataclass(frozen=True)
class MapOf(Shape):
    """An object whose every value has ``shape`` (any keys)."""

    shape: Shape

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise ShapeError(where, f"is {_shown(value)}, not an object")
        for key, item in value.items():
            self.shape.check(item, _at(where, key))


@dataclass(frozen=True)
class Fields(Shape):
    """An object with the ``required`` keys and perhaps the ``optional`` ones, each of its shape (others pass)."""

    required: Mapping[str, Shape] = field(default_factory=dict)
    optional: Mapping[str, Shape] = field(default_factory=dict)

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise ShapeError(where, f"is {_shown(value)}, not an object")
        for key, shape in self.required.items():
            if key not in value:
                raise ShapeError(where, f"has no field {key!r}")
            shape.check(value[key], _at(where, key))
        for key, shape in self.optional.items():
            if key in value:
                shape.check(value[key], _at(where, key))


#: Bounds of the files detr_peg writes and reads back (a study's plan of 10,000 cells is a few MiB).
KIND = "record"


def read_json_file(
    path: str | os.PathLike,
    shape: Shape,
    what: str,
    advice: str,
    error: Callable[[str], UserError] = UserError,
    kind: str = KIND,
) -> Any | None:
    """The content of ``path`` (None when absent), bounded by ``kind`` and checked against ``shape``.

    Raises ``error`` naming ``what``, the field and the value, then ``advice``.
    """
    if not os.path.lexists(path):
        return None
    data = parse_json(read_bounded_bytes(path, what, kind, error), path, what, kind, error, advice)
    try:
        shape.check(data, "")
    except ShapeError as err:
        raise error(f"{what} {path}: {err}; {advice}") from None
    return data
