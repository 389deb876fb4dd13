"""The JSON records of a study's dataclasses, without the :func:`message_only` fields that only word messages."""

from __future__ import annotations

import dataclasses
from typing import Any

#: The ``metadata`` of a field declared with :func:`message_only`.
_MESSAGE_ONLY = {"message_only": True}


def message_only(default: Any) -> Any:
    """A dataclass field that words messages only: not compared (``==``), not hashed, not recorded."""
    return dataclasses.field(default=default, compare=False, metadata=_MESSAGE_ONLY)


def record(value: Any) -> Any:
    """``value`` as JSON-ready data: dataclasses as dicts without :func:`message_only` fields, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: record(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not f.metadata.get("message_only")
        }
    if isinstance(value, (list, tuple)):
        return [record(v) for v in value]
    if isinstance(value, dict):
        return {k: record(v) for k, v in value.items()}
    return value
