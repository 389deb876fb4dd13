"""Registries: lookups of unknown names, and the import of the built-in entries on the first read."""

from __future__ import annotations

import re
import sys

import pytest

from detr_peg import registry
from detr_peg.errors import ConfigError
from detr_peg.registry import Registry
from tests.conftest import run_python


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


def test_a_registry_imports_its_built_in_modules_at_its_first_read(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "parts_home.py").write_text(
        'from detr_peg.registry import Registry\nPARTS = Registry("part", builtins=("parts_built_in",))\n'
    )
    (tmp_path / "parts_built_in.py").write_text('from parts_home import PARTS\nPARTS.register("built_in")(len)\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("parts_home", "parts_built_in"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    from parts_home import PARTS  # written by this test

    PARTS.register("mine")(abs)
    assert "parts_built_in" not in sys.modules  # registering is not reading
    assert PARTS.names() == ["built_in", "mine"] and "parts_built_in" in sys.modules
    assert PARTS.get("built_in") is len and len(PARTS) == 2


def test_the_convert_formats_are_listed_whichever_module_was_imported_first() -> None:
    code = (
        "from detr_peg.convert.registry import OFFICIAL_FORMATS, TRANSFORMERS_FORMATS\n"
        "print(OFFICIAL_FORMATS.names(), TRANSFORMERS_FORMATS.names())\n"
    )
    proc = run_python("-c", code, timeout=120)  # a fresh interpreter: no converter imported
    assert proc.stdout.splitlines() == ["['deformable_detr', 'detr'] ['deformable_detr', 'detr']"], proc.stderr[-2000:]


def _returns_none(*args, **kwargs):
    return None


def _takes_nothing():
    return None


@pytest.mark.parametrize(
    ("builder", "words"),
    [(_returns_none, "(_returns_none) returned NoneType, not a {kind}."),
     (_takes_nothing, "(_takes_nothing) does not take the arguments of its registry (too many positional")],
)  # fmt: skip
@pytest.mark.parametrize("part", ["backbone", "encoding"])
def test_a_user_registration_that_breaks_its_contract_is_named(monkeypatch, part, builder, words) -> None:
    """A builder that returns the wrong thing or takes other arguments is named where it is called, not deep inside."""
    from detr_peg.config import load_config
    from detr_peg.models import build_model
    from detr_peg.models.backbones import BACKBONES
    from detr_peg.models.position.registry import POSITION_ENCODINGS

    parts = BACKBONES if part == "backbone" else POSITION_ENCODINGS
    parts.names()  # the built-in entries first
    name = "sine" if part == "encoding" else "torchvision"
    monkeypatch.setitem(parts._entries, name, builder)
    kind = "Backbone" if part == "backbone" else "PositionalEncoding"
    label = "backbone source" if part == "backbone" else "positional encoding"
    cfg = load_config(None, ["model.num_classes=2", "model.backbone.weights=null", "model.backbone.name=resnet18"])
    with pytest.raises(ConfigError, match="^" + re.escape(f"The {label} {name!r} " + words.format(kind=kind))):
        build_model(cfg)


def test_register_architecture_takes_an_architecture_only() -> None:
    from detr_peg.models.registry import register_architecture

    with pytest.raises(
        TypeError, match=r"^register_architecture\('mine', \.\.\.\) takes an Architecture, got object\.$"
    ):
        register_architecture("mine", object())


@pytest.mark.parametrize("name", [123, "", "  ", b"mine"])
def test_a_name_that_is_no_name_is_refused_at_registration(name) -> None:
    parts: Registry = Registry("part")
    with pytest.raises(
        ValueError, match=rf"^a part is registered under a non-empty string, got {re.escape(repr(name))}$"
    ):
        parts.register(name)
    parts.register(None)(abs)  # no name: the object's own
    assert parts.names() == ["abs"]
