"""Short forms of long values and lists for one-line user messages; imports nothing from detr_peg."""

from __future__ import annotations

import re
from collections.abc import Iterable


def one_line(text: str) -> str:
    """``text`` with control and other invisible characters as escapes (``\\n``, ``\\x1b``): a value read from a
    file or typed by the user keeps a message on one line and sends no terminal codes."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def shortened(text: str, limit: int = 60) -> str:
    """``text``, or its start and end around ``...`` plus its length when longer than ``limit``."""
    half = max(limit // 2, 1)
    short = f"{text[:half]}...{text[-half:]} ({len(text)} characters)"
    return text if len(text) <= limit or len(short) >= len(text) else short


def listed(items: Iterable[object], limit: int = 3) -> str:
    """The first ``limit`` items joined by commas, ``, ...`` after them when there are more; empty for none."""
    items = [str(item) for item in items]
    return ", ".join(items[:limit]) + (", ..." if len(items) > limit else "")


def extras() -> dict[str, tuple[str, ...]]:
    """The optional extras of the installed detr_peg and their packages (empty when not installed)."""
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
    """How to install the optional ``module``: the packages of the smallest extra that has it, by name."""
    if module == "detectron2":  # not on PyPI
        return "pip install 'git+https://github.com/facebookresearch/detectron2.git' (it is not on PyPI)"
    declared = extras()
    having = sorted((len(packages), name) for name, packages in declared.items() if module in packages)
    if not having:
        return f"pip install {module}"
    extra = having[0][1]
    return f"pip install {' '.join(declared[extra])} (the {extra!r} extra of detr_peg)"
