"""Names of a package imported on first use (PEP 562), so ``--help`` and input checks run before torch is imported.

Imports nothing from detr_peg.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str,
    exports: Mapping[str, str],
    *,
    eager: Iterable[str] = (),
    first: Mapping[str, str] | None = None,
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for a package whose ``exports`` (name -> module) load on first use.

    ``eager``: names the package defines itself; ``first``: module -> a module to import before it.
    """
    exports = dict(exports)
    first = dict(first or {})
    names = sorted({*eager, *exports})

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if module in first:
            importlib.import_module(first[module])
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return list(names)

    return list(names), __getattr__, __dir__
