"""Run a script of ``tools/`` in this process: its module, and ``main(argv)`` with what it printed."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from types import ModuleType

import pytest

from tests.conftest import REPO_ROOT


def load_tool(relative: str) -> ModuleType:
    """The module of the script ``relative`` (``tools/box_scale.py``), loaded from the checkout."""
    spec = importlib.util.spec_from_file_location(relative.replace("/", "_").removesuffix(".py"), REPO_ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass
class ToolResult:
    returncode: int
    stdout: str
    stderr: str


def run_main(tool: ModuleType, capsys: pytest.CaptureFixture, *argv: str) -> ToolResult:
    """``tool.main(argv)`` with its exit status (argparse's ``SystemExit`` included) and its output."""
    capsys.readouterr()
    try:
        code = tool.main(list(argv))
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    # sys.exit(status) as argparse does; sys.exit("message") is exit status 1, as Python gives it.
    return ToolResult(code if isinstance(code, int) else (0 if code is None else 1), out, err)
