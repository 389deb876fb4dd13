"""Every Python block of the README runs as written, offline, after the demo.

The blocks refer to the files ``detr-peg demo`` writes (``outputs/demo/...``)
and to the repository's ``configs/``; they run in a fresh interpreter in a
folder holding a copy of a tiny demo's output there, with every network
connection refused. Blocks that import an optional package that is not
installed (detectron2) are skipped with a reason.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, run_python

#: Runs before each block: a block that reaches for the network fails here instead of hanging.
OFFLINE = """
import socket
def _refuse(*args, **kwargs):
    raise OSError("network access in a README block")
socket.socket.connect = _refuse
socket.create_connection = _refuse
"""


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line, code)`` of every fenced ``python`` block."""
    return [(text[: m.start()].count("\n") + 1, m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]


BLOCKS = python_blocks((REPO_ROOT / "README.md").read_text())


def test_the_readme_has_its_python_blocks_and_the_first_is_three_lines() -> None:
    assert len(BLOCKS) >= 4
    first = [line for line in BLOCKS[0][1].splitlines() if line.strip()]
    assert len(first) == 3 and first[0] == "import detr_peg" and "Detector.from_checkpoint" in first[1]


@pytest.fixture(scope="module")
def workdir(tiny_demo_dir: Path, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("readme")
    shutil.copytree(tiny_demo_dir, folder / "outputs" / "demo", ignore=shutil.ignore_patterns("stdout.txt"))
    (folder / "configs").symlink_to(REPO_ROOT / "configs")
    return folder


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_python_block_runs_as_written(workdir: Path, line: int, code: str) -> None:
    for module in re.findall(r"^\s*(?:from|import) (\w+)", code, re.M):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the block at README.md line {line} needs {module}, which is not installed")
    proc = run_python("-c", OFFLINE + code, cwd=workdir, HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, f"README.md line {line}:\n{proc.stderr[-3000:]}"
