"""The package's shape, held by the figures of ``tools/layout_figures.py``: the core's and the lab's
lines, the docstrings' share, the defensive modules, import circles, how many files a config value,
an image and `detr-peg train` cross, and the tracked files. Short functions, and help that loads no torch."""

from __future__ import annotations

import ast
import json

import pytest

from tests.conftest import REPO_ROOT, main_in_fresh_interpreter, run_python

MAX_FUNCTION_LINES = 80
#: Ceilings of tools/layout_figures.py's figures; lower one when a change lowers its figure.
CEILINGS = {
    "core_lines": 17700,
    "lab_lines": 4920,
    "core_docstring_share": 0.13,
    "defensive_lines": 1129,
    "tracked_files": 600,
    "config_path_files": 6,
    "predict_path_files": 8,
    "train_path_files": 13,
}


@pytest.fixture(scope="module")
def figures() -> dict:
    proc = run_python("tools/layout_figures.py", "--json", timeout=300, fresh=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CEILINGS))
def test_figure_is_within_its_ceiling(figures: dict, name: str) -> None:
    value = figures[name]
    measured = len(value) if isinstance(value, list) else value
    assert measured <= CEILINGS[name], (name, value)


@pytest.mark.slow
def test_no_import_circle_and_the_paths_start_where_they_should(figures: dict) -> None:
    assert figures["import_circles"] == []
    assert "detr_peg/detector.py" in figures["predict_path_files"]
    assert "detr_peg/engine/optimizer.py" in figures["config_path_files"]
    assert {"detr_peg/cli/train.py", "detr_peg/engine/trainer.py"} <= set(figures["train_path_files"])
    assert not [f for f in figures["predict_path_files"] if f.startswith("detr_peg/models/")]


def test_no_function_is_longer_than_80_lines() -> None:
    long = []
    for path in sorted((REPO_ROOT / "detr_peg").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


@pytest.mark.parametrize("words", [["--help"], ["train", "--help"], ["eval", "--help"], ["export", "--help"]])
def test_help_loads_neither_torch_nor_the_models(words: list[str]) -> None:
    proc, probe = main_in_fresh_interpreter(*words)
    assert probe == {"status": 0, "heavy": []} and "usage: detr-peg" in proc.stdout


_IMPORT_ALL = """
import importlib, json, pathlib
missing = {}
for path in sorted(pathlib.Path("detr_peg").rglob("*.py")):
    name = ".".join(path.with_suffix("").parts).removesuffix(".__init__")
    try:
        importlib.import_module(name)
    except ImportError as exc:  # an optional dependency that is not installed
        if isinstance(exc, ModuleNotFoundError) and exc.name.startswith("detr_peg"):
            raise
        missing[name] = str(exc)
print(json.dumps(missing))
"""


@pytest.mark.slow
def test_every_module_imports_without_docstrings() -> None:
    """``python -OO`` strips docstrings: no module may need one to import (the command help falls back to one line)."""
    proc = run_python("-OO", "-c", _IMPORT_ALL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    missing = json.loads(proc.stdout)
    assert all(name.startswith("detr_peg.integrations.detectron2") for name in missing), missing
