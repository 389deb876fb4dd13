"""The packages' public names, imported on first use: each resolves to the object of the module its package
names, importing a package loads none of them (nor torch), an unknown name is an ``AttributeError`` naming the
package, and ``detr_peg.Config`` registers the models' config fields first."""

from __future__ import annotations

import json
import sys
import types

import pytest

from detr_peg.lazy_exports import lazy_exports
from tests.conftest import run_python

PACKAGES = [
    "detr_peg",
    "detr_peg.checkpoint",
    "detr_peg.convert",
    "detr_peg.data",
    "detr_peg.engine",
    "detr_peg.export",
]
TOY_MODULES = ("lazy_registry", "lazy_target", "lazy_other")


@pytest.fixture
def toy_modules(tmp_path, monkeypatch):
    """Three modules on ``sys.path``; the target reads the registry when it is imported (fails unless it came
    first). Removed from ``sys.modules`` afterwards."""
    (tmp_path / "lazy_registry.py").write_text("FIELDS = ['size']\n")
    (tmp_path / "lazy_target.py").write_text("import sys\nFIELDS = list(sys.modules['lazy_registry'].FIELDS)\n")
    (tmp_path / "lazy_other.py").write_text("def helper():\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not set(TOY_MODULES) & set(sys.modules)
    yield
    for name in TOY_MODULES:
        sys.modules.pop(name, None)


def test_names_resolve_on_first_use_and_the_first_modules_are_imported_before(toy_modules) -> None:
    module = types.ModuleType("pkg")
    module.__all__, module.__getattr__, module.__dir__ = lazy_exports(
        "pkg",
        {"helper": "lazy_other", "FIELDS": "lazy_target"},
        eager=("VERSION",),
        first={"lazy_target": "lazy_registry"},
    )
    assert module.__all__ == ["FIELDS", "VERSION", "helper"] == dir(module)
    assert not set(TOY_MODULES) & set(sys.modules)  # nothing imported yet
    assert module.helper() == 3 and "lazy_registry" not in sys.modules  # only what was asked for
    assert module.FIELDS == ["size"] and module.FIELDS is sys.modules["lazy_target"].FIELDS
    with pytest.raises(AttributeError, match=r"^module 'pkg' has no attribute 'loads'$"):
        module.loads  # noqa: B018


#: In a fresh interpreter: import each package and record what that loaded; then resolve every public name
#: and compare it with the object of the module the package's ``_EXPORTS`` names.
PROBE = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    before = set(sys.modules)
    package = importlib.import_module(name)
    loaded = sorted(m for m in set(sys.modules) - before if m.startswith(("torch", "detr_peg.")) and m != name)
    out[name] = {"all": package.__all__, "dir": dir(package), "loaded": loaded}
out["helper_is_a_module"] = type(sys.modules["detr_peg"].lazy_exports).__name__ == "module"
for name in sys.argv[1:]:
    package, wrong = sys.modules[name], []
    for attribute, home in vars(package)["_EXPORTS"].items():
        if getattr(package, attribute) is not getattr(importlib.import_module(home), attribute):
            wrong.append(attribute)
    try:
        package.no_such_name
        wrong.append("no_such_name")
    except AttributeError as exc:
        if str(exc) != f"module {name!r} has no attribute 'no_such_name'":
            wrong.append(str(exc))
    out[name]["wrong"] = wrong
print(json.dumps(out))
"""


def test_importing_a_package_loads_nothing_and_every_public_name_resolves() -> None:
    proc = run_python("-c", PROBE, *PACKAGES, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result.pop("helper_is_a_module") is True  # `detr_peg.lazy_exports` stays the module
    for name in PACKAGES:
        got = result[name]
        assert got["all"] == sorted(got["all"]) == got["dir"], name
        # Importing the package loads only the helper (with `detr_peg` itself), never torch.
        assert set(got["loaded"]) <= {"detr_peg.lazy_exports"}, (name, got["loaded"])
        assert got["wrong"] == [], name


def test_config_names_register_the_models_config_fields_first() -> None:
    code = (
        "import sys, detr_peg\n"
        "assert 'detr_peg.models' not in sys.modules\n"
        "cfg = detr_peg.load_config(None, ['model.position.name=peg'])\n"
        "print('models' if 'detr_peg.models' in sys.modules else 'none', cfg.model.position.name)\n"
    )
    proc = run_python("-c", code, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["models", "peg"]
