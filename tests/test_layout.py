"""The package's shape: short functions, a short way from `detr-peg train` to the first iteration, and help
that loads no torch."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO_ROOT, main_in_fresh_interpreter, run_python

MAX_FUNCTION_LINES = 80
MAX_TRAIN_PATH_FILES = 13  # 12, plus cli/option_types.py since --config also takes a shipped config's name


def test_no_function_is_longer_than_80_lines() -> None:
    long = []
    for path in sorted((REPO_ROOT / "detr_peg").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


@pytest.mark.slow
def test_the_way_from_train_to_the_first_iteration_crosses_at_most_13_files() -> None:
    proc = run_python("tools/trace_train_path.py", timeout=300, fresh=True)  # it traces the imports too
    assert proc.returncode == 0, proc.stderr[-2000:]
    header = next(line for line in proc.stdout.splitlines() if line.startswith("Orchestration"))
    count = int(header.split(":")[1].split()[0])
    files = [line.split()[0] for line in proc.stdout.split("Everything else")[0].splitlines() if line.startswith("  ")]
    assert len(files) == count and "detr_peg/engine/trainer.py" in files and "detr_peg/cli/train.py" in files
    assert count <= MAX_TRAIN_PATH_FILES, files


@pytest.mark.parametrize("words", [["--help"], ["train", "--help"], ["eval", "--help"], ["export", "--help"]])
def test_help_loads_neither_torch_nor_the_models(words: list[str]) -> None:
    proc, probe = main_in_fresh_interpreter(*words)
    assert probe == {"status": 0, "heavy": []} and "usage: detr-peg" in proc.stdout
