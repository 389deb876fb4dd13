"""How a user-facing message shows a long value or a long list: :func:`shortened` and :func:`listed`.

A message stays one readable line whatever it names: a path of 4,000
characters, a 5,000-digit integer, a repr of a whole checkpoint entry, or the
names of 300 cells. Imports nothing from detr_peg.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def shortened(text: str, limit: int = 60) -> str:
    """``text`` whole when it has at most ``limit`` characters (or shortening would not make it shorter), else
    its start and end around ``...`` and its length.

    ``shortened("v" * 100, 20)`` is ``"vvvvvvvvvv...vvvvvvvvvv (100 characters)"``: the end of a path (its file
    name) and the start of a value both stay readable.
    """
    half = max(limit // 2, 1)
    short = f"{text[:half]}...{text[-half:]} ({len(text)} characters)"
    return text if len(text) <= limit or len(short) >= len(text) else short


def listed(items: Iterable[object], limit: int = 3) -> str:
    """The first ``limit`` items joined by commas, ``, ...`` after them when there are more; empty for none."""
    items = [str(item) for item in items]
    return ", ".join(items[:limit]) + (", ..." if len(items) > limit else "")


def extras() -> dict[str, tuple[str, ...]]:
    """The optional extras of the installed detr_peg and the packages each brings (its metadata, as
    ``pyproject.toml`` declares them; empty when detr_peg is not installed)."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    try:
        requirements = [Requirement(text) for text in requires("detr_peg") or []]
    except PackageNotFoundError:
        return {}
    found: dict[str, tuple[str, ...]] = {}
    for requirement in requirements:
        for extra in re.findall(r'extra == "([^"]+)"', str(requirement.marker or "")):
            found[extra] = (*found.get(extra, ()), requirement.name)
    return found


def install_hint(module: str) -> str:
    """How to install the optional ``module``: the packages of the smallest extra that has it, by name, which
    works from a wheel or a checkout alike (``detr_peg[extra]`` resolves only where detr_peg is on an index)."""
    if module == "detectron2":  # not on PyPI
        return "pip install 'git+https://github.com/facebookresearch/detectron2.git' (it is not on PyPI)"
    declared = extras()
    having = sorted((len(packages), name) for name, packages in declared.items() if module in packages)
    if not having:
        return f"pip install {module}"
    extra = having[0][1]
    return f"pip install {' '.join(declared[extra])} (the {extra!r} extra of detr_peg)"
