"""Name -> builder registries for the pluggable parts of detr_peg (``@BACKBONES.register("timm")``).

An unknown name raises :class:`~detr_peg.errors.ConfigError` listing the valid names.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from detr_peg.errors import ConfigError

T = TypeVar("T", bound=Callable)

#: Run once, before the first read of any registry (see :func:`fill_on_first_read`); None when done or unset.
_filler: Callable[[], object] | None = None


def fill_on_first_read(filler: Callable[[], object]) -> None:
    """Have ``filler`` run once, the first time any registry is read (not on register).

    The command line fills registries lazily so that errors found before any lookup answer without importing torch.
    """
    global _filler
    _filler = filler


def _fill() -> None:
    global _filler
    filler, _filler = _filler, None  # unset first: the filler's imports register entries
    if filler is not None:
        filler()


class Registry(Generic[T]):
    """A mapping from names to builders; ``doc`` is the entries' contract, ``builtins`` are imported on first read."""

    def __init__(self, name: str, doc: str = "", builtins: tuple[str, ...] = ()) -> None:
        self.name = name
        self.__doc__ = doc or f"Registry of {name}s."
        self._entries: dict[str, T] = {}
        self._builtins = builtins

    def _read(self) -> None:
        """Run the filler and import the built-in modules (once), before a read."""
        _fill()
        builtins, self._builtins = self._builtins, ()  # unset first: the imports register entries
        for module in builtins:
            importlib.import_module(module)

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Decorator that registers ``obj`` under ``name`` (default: its ``__name__``)."""

        if name is not None and not (isinstance(name, str) and name.strip()):
            raise ValueError(f"a {self.name} is registered under a non-empty string, got {name!r}")

        def decorator(obj: T) -> T:
            key = name or obj.__name__
            if key in self._entries:
                raise ValueError(f"{self.name} {key!r} is already registered")
            self._entries[key] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        """The entry registered as ``name``; ``ConfigError`` listing valid names otherwise."""
        self._read()
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(repr(n) for n in sorted(self._entries))
            raise ConfigError(f"Unknown {self.name} {name!r}: valid are {valid}.") from None

    def build(self, name: str, kind: type, *args: Any, **kwargs: Any) -> Any:
        """Call the entry ``name`` with the arguments of the registry's contract; ConfigError naming the entry when
        it does not take them or returns no ``kind`` (a user's registration, found here rather than deep inside)."""
        builder = self.get(name)
        where = f"The {self.name} {name!r} ({getattr(builder, '__qualname__', type(builder).__name__)})"
        try:
            inspect.signature(builder).bind(*args, **kwargs)
        except TypeError as exc:
            raise ConfigError(f"{where} does not take the arguments of its registry ({exc}).") from None
        built = builder(*args, **kwargs)
        if not isinstance(built, kind):
            raise ConfigError(f"{where} returned {type(built).__name__}, not a {kind.__name__}.")
        return built

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
