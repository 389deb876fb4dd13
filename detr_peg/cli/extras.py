"""Optional dependencies: which ``detr_peg[extra]`` brings a missing package, said in one line (:func:`require`)."""

from __future__ import annotations

import importlib.util
import sys
from typing import NoReturn

from detr_peg.messages import install_hint


def missing(*modules: str) -> list[str]:
    """The modules of ``modules`` that cannot be imported (``sys.modules[name] = None`` blocks one, as for import)."""
    return [
        name
        for name in modules
        if (sys.modules[name] is None if name in sys.modules else importlib.util.find_spec(name) is None)
    ]


def require(program: str, *modules: str) -> None:
    """Return when every module of ``modules`` is installed; else print one line naming what to install and exit 2."""
    absent = missing(*modules)
    if absent:
        how = install_hint(absent[0])
        _exit(f"{program}: error: {absent[0]} is not installed; install it with {how}.")


def _exit(message: str) -> NoReturn:
    print(message, file=sys.stderr)
    raise SystemExit(2)
