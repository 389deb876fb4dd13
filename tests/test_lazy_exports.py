"""The packages' public names, imported on first use: each resolves to its module's object, importing a
package loads none of them (nor torch), an unknown name is an ``AttributeError`` naming the package, and
``detr_peg.Config`` registers the models' config fields first."""

from __future__ import annotations

import importlib
import json
import sys
import types

import pytest

from detr_peg.lazy_exports import lazy_exports
from tests.conftest import run_python

PACKAGES = ["detr_peg", "detr_peg.convert", "detr_peg.data", "detr_peg.engine", "detr_peg.export", "detr_peg.fileio"]


def test_names_resolve_on_first_use_and_the_first_modules_are_imported_before(tmp_path, monkeypatch) -> None:
    (tmp_path / "lazy_registry.py").write_text("FIELDS = ['size']\n")
    # The target reads what the registry holds when it is imported: it fails unless the registry came first.
    (tmp_path / "lazy_target.py").write_text("import sys\nFIELDS = list(sys.modules['lazy_registry'].FIELDS)\n")
    (tmp_path / "lazy_other.py").write_text("def helper():\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("lazy_registry", "lazy_target", "lazy_other"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    module = types.ModuleType("pkg")
    module.__all__, module.__getattr__, module.__dir__ = lazy_exports(
        "pkg",
        {"helper": "lazy_other", "FIELDS": "lazy_target"},
        eager=("VERSION",),
        first={"lazy_target": "lazy_registry"},
    )
    assert module.__all__ == ["FIELDS", "VERSION", "helper"] == dir(module)
    assert module.helper() == 3 and "lazy_registry" not in sys.modules  # only what was asked for
    assert module.FIELDS == ["size"] and module.FIELDS is sys.modules["lazy_target"].FIELDS
    with pytest.raises(AttributeError, match=r"^module 'pkg' has no attribute 'loads'$"):
        module.loads  # noqa: B018


#: In a fresh interpreter: import each package, record what it loaded, then resolve every public name.
PROBE = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    before = set(sys.modules)
    package = importlib.import_module(name)
    loaded = sorted(m for m in set(sys.modules) - before if m.startswith(("torch", "detr_peg.")) and m != name)
    out[name] = {"all": package.__all__, "dir": dir(package), "loaded": loaded}
config_first = "detr_peg.models" not in sys.modules
import detr_peg
detr_peg.Config
out["models_before_config"] = config_first and "detr_peg.models" in sys.modules
print(json.dumps(out))
"""


def test_importing_a_package_loads_nothing_and_every_public_name_resolves() -> None:
    proc = run_python("-c", PROBE, *PACKAGES, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result.pop("models_before_config") is True
    for name in PACKAGES:
        got = result[name]
        assert got["all"] == sorted(got["all"]) == got["dir"], name
        # Importing the package loads only detr_peg's bottom layer (the helper, errors), never torch.
        assert set(got["loaded"]) <= {"detr_peg.lazy_exports", "detr_peg.errors"}, (name, got["loaded"])
    for name in PACKAGES:
        package = importlib.import_module(name)
        for attribute in package.__all__:
            value = getattr(package, attribute)
            home = getattr(value, "__module__", None)
            if home is not None and home.startswith("detr_peg."):
                assert getattr(importlib.import_module(home), attribute) is value, (name, attribute)
        with pytest.raises(AttributeError, match=rf"^module '{name}' has no attribute 'no_such_name'$"):
            package.no_such_name  # noqa: B018
