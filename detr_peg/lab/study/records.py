"""The JSON records of a study's dataclasses, without the fields that only word messages.

A study's definition, its cells and its comparison options are written to
``plan.json`` and ``cell.json`` and compared with what a folder holds when a
study resumes. Some of their fields say only where a value was given
(``--grid``, ``s.yaml: grid``), for error messages: they are not part of what
the value means, so they are neither compared nor recorded. Such a field is
declared with :func:`message_only`, and :func:`record` leaves it out at any
depth; nothing strips it by hand.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: The ``metadata`` of a field declared with :func:`message_only`.
_MESSAGE_ONLY = {"message_only": True}


def message_only(default: Any) -> Any:
    """A dataclass field that words messages only: not compared (``==``), not hashed, not recorded."""
    return dataclasses.field(default=default, compare=False, metadata=_MESSAGE_ONLY)


def record(value: Any) -> Any:
    """``value`` as JSON-ready data: dataclasses as dicts without their :func:`message_only` fields, tuples as lists.

    Args:
        value: a dataclass instance, or a list, tuple or dict of them, or a plain value (returned as is).
    """
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
