"""Declared shapes of the JSON files a study writes and reads back: damage is one sentence naming the file, the
field and the value, never a ``KeyError`` deep in the report.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from detr_peg.bounded_read import parse_json, read_bounded_bytes
from detr_peg.errors import UserError
from detr_peg.messages import shortened


class ShapeError(Exception):
    """A value without its declared shape, at ``where`` (``definition.seeds``)."""


def _fail(where: str, value: Any, problem: str) -> ShapeError:
    shown = {dict: "an object", list: "a list"}.get(type(value)) or shortened(json.dumps(value, allow_nan=True))
    return ShapeError(f"{where or 'the file'} is {shown}, {problem}")


def _at(where: str, key: str | int) -> str:
    return f"{where}[{key}]" if isinstance(key, int) else (f"{where}.{key}" if where else key)


class Shape:
    def check(self, value: Any, where: str) -> None:  # pragma: no cover - every shape overrides it
        raise NotImplementedError


@dataclass(frozen=True)
class Number(Shape):
    """A finite number (not a boolean), above ``above`` when given."""

    above: float | None = None

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise _fail(where, value, "not a finite number")
        if self.above is not None and value <= self.above:
            raise _fail(where, value, f"not above {self.above:g}")


@dataclass(frozen=True)
class Integer(Shape):
    """A whole number (not a boolean) from ``minimum`` to ``maximum``."""

    minimum: int = -(2**63)
    maximum: int = 2**63 - 1

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _fail(where, value, "not a whole number")
        if not self.minimum <= value <= self.maximum:
            raise _fail(where, value, f"not from {self.minimum} to {self.maximum:,}")


@dataclass(frozen=True)
class Text(Shape):
    """A string, one of ``choices`` when given."""

    choices: tuple[str, ...] = ()

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, str) or (self.choices and value not in self.choices):
            raise _fail(where, value, f"not one of {', '.join(self.choices)}" if self.choices else "not a string")


@dataclass(frozen=True)
class Flag(Shape):
    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, bool):
            raise _fail(where, value, "not true or false")


@dataclass(frozen=True)
class Anything(Shape):
    def check(self, value: Any, where: str) -> None:
        return None


@dataclass(frozen=True)
class Nullable(Shape):
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
        if not isinstance(value, list) or len(value) < self.min_length:
            raise _fail(where, value, f"not a list of at least {self.min_length} values")
        for index, item in enumerate(value):
            self.shape.check(item, _at(where, index))


@dataclass(frozen=True)
class MapOf(Shape):
    """An object whose every value has ``shape``."""

    shape: Shape

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _fail(where, value, "not an object")
        for key, item in value.items():
            self.shape.check(item, _at(where, key))


@dataclass(frozen=True)
class Fields(Shape):
    """An object with the ``required`` keys and perhaps the ``optional`` ones, each of its shape (others pass)."""

    required: Mapping[str, Shape] = field(default_factory=dict)
    optional: Mapping[str, Shape] = field(default_factory=dict)

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _fail(where, value, "not an object")
        for key, shape in [*self.required.items(), *self.optional.items()]:
            if key in value:
                shape.check(value[key], _at(where, key))
            elif key in self.required:
                raise ShapeError(f"{where or 'the file'} has no field {key!r}")


def read_json_file(
    path: str | os.PathLike, shape: Shape, what: str, advice: str, error: Callable[[str], UserError] = UserError
) -> Any | None:
    """The content of ``path`` (None when absent), bounded and checked against ``shape``; raises ``error``."""
    if not os.path.lexists(path):
        return None
    data = parse_json(read_bounded_bytes(path, what, "record", error), path, what, "record", error, advice)
    try:
        shape.check(data, "")
    except ShapeError as err:
        raise error(f"{what} {path}: {err}; {advice}") from None
    return data
