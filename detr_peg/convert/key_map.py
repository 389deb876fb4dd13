"""Explicit, ordered renaming rules between official and detr_peg state-dict keys."""

from __future__ import annotations

import re
from collections.abc import Sequence


class KeyMap:
    """Ordered ``(regex, replacement)`` rules on whole keys: first match wins, ``None`` drops, unmatched keys stay."""

    def __init__(self, rules: Sequence[tuple[str, str | None]]) -> None:
        self.rules = [(re.compile(p), r) for p, r in rules]

    def __call__(self, key: str) -> str | None:
        for pattern, replacement in self.rules:
            if pattern.fullmatch(key):
                return None if replacement is None else pattern.sub(replacement, key)
        return key

    def describe(self) -> list[str]:
        """Human-readable rules."""
        return [f"{p.pattern} -> {r if r is not None else '(dropped)'}" for p, r in self.rules]
