"""Names of a package imported on first use (PEP 562), so importing the package loads none of its modules.

The packages that commands import before torch (``detr_peg`` and its
``convert``, ``data``, ``engine``, ``export`` and ``fileio`` packages) expose
their public names this way, so that commands can check their inputs, and
print ``--help``, before torch is imported::

    from detr_peg.lazy_exports import lazy_exports as _lazy_exports

    _EXPORTS = {"export_onnx": "detr_peg.export.onnx_export"}
    __all__, __getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)

(Imported under another name: in ``detr_peg`` itself, the name
``lazy_exports`` is this module.)

Imports nothing from detr_peg (the bottom layer, beside :mod:`detr_peg.errors`).
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
    """``__all__``, ``__getattr__`` and ``__dir__`` for a package whose names are imported on first use.

    Args:
        package: the package's ``__name__`` (named in the ``AttributeError`` of an unknown name).
        exports: public name -> the module that defines it.
        eager: names the package defines itself (listed in ``__all__`` and ``__dir__``).
        first: module of ``exports`` -> a module to import before it (one whose import registers what the
            first one reads).

    Returns:
        ``(__all__, __getattr__, __dir__)``, to assign in the package: ``__all__`` sorted.
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
