"""Registries: lookups of unknown names, and the import of the built-in entries on the first read."""

from __future__ import annotations

import pytest

from detr_peg import registry
from detr_peg.errors import ConfigError
from detr_peg.registry import Registry


def test_the_filler_runs_once_at_the_first_read_and_not_at_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    parts: Registry = Registry("part")
    calls = []

    def filler() -> None:
        calls.append(1)
        parts.register("built_in")(len)  # what an import of the model modules does

    monkeypatch.setattr(registry, "_filler", None)
    registry.fill_on_first_read(filler)
    parts.register("mine")(abs)
    assert calls == []
    assert "built_in" in parts and calls == [1]
    assert parts.names() == ["built_in", "mine"] and len(parts) == 2 and parts.get("mine") is abs
    assert calls == [1]
    with pytest.raises(ConfigError, match=r"^Unknown part 'other': valid are 'built_in', 'mine'\.$"):
        parts.get("other")
