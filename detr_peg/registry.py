"""Name -> builder registries for the pluggable parts of detr_peg.

Each registry states its contract in its docstring (what a registered builder
takes and returns). Components are registered with a decorator::

    @BACKBONES.register("timm")
    def build_timm_backbone(cfg, out_stages): ...

and looked up by the name given in a config. An unknown name raises
:class:`~detr_peg.errors.ConfigError` listing the valid names, so a typo in a
config is one clear sentence, never a ``KeyError``.

The built-in entries are registered when their modules are imported
(``import detr_peg.models``). The command line does not import them before
every command: it hands that import to :func:`fill_on_first_read`, which runs
it the first time any registry is read, so that a command stopped by an error
found before any name is looked up (a config file that is not there, a
``key=value`` that does not parse) answers without importing torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from detr_peg.errors import ConfigError

T = TypeVar("T", bound=Callable)

#: Run once, before the first read of any registry (see :func:`fill_on_first_read`); None when done or unset.
_filler: Callable[[], object] | None = None


def fill_on_first_read(filler: Callable[[], object]) -> None:
    """Have ``filler`` (e.g. ``lambda: importlib.import_module("detr_peg.models")``) run once, the first time
    any registry is read (looked up, listed, counted or tested for a name); registering does not run it."""
    global _filler
    _filler = filler


def _fill() -> None:
    global _filler
    filler, _filler = _filler, None  # unset first: the filler's imports register entries
    if filler is not None:
        filler()


class Registry(Generic[T]):
    """A mapping from names to builders (functions or classes).

    Args:
        name: what the registry holds, in words ("positional encoding"); used
            in error messages.
        doc: the contract every entry must fulfil.
        builtins: the modules whose import registers the built-in entries,
            imported the first time this registry is read, so that a reader
            sees them whichever module of the package it imported first.
    """

    def __init__(self, name: str, doc: str = "", builtins: tuple[str, ...] = ()) -> None:
        self.name = name
        self.__doc__ = doc or f"Registry of {name}s."
        self._entries: dict[str, T] = {}
        self._builtins = builtins

    def _read(self) -> None:
        """Run the command line's filler and import this registry's built-in modules (once), before a read."""
        _fill()
        builtins, self._builtins = self._builtins, ()  # unset first: the imports register entries
        for module in builtins:
            importlib.import_module(module)

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Decorator that registers ``obj`` under ``name`` (default: its ``__name__``)."""

        def decorator(obj: T) -> T:
            key = name or obj.__name__
            if key in self._entries:
                raise ValueError(f"{self.name} {key!r} is already registered")
            self._entries[key] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        """Return the entry registered as ``name``.

        Raises:
            ConfigError: ``name`` is not registered; the message lists valid names.
        """
        self._read()
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(repr(n) for n in sorted(self._entries))
            raise ConfigError(f"Unknown {self.name} {name!r}: valid are {valid}.") from None

    def names(self) -> list[str]:
        """Sorted registered names."""
        self._read()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._read()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._read()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.name!r}, entries={self.names()})"
