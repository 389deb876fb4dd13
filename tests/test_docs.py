"""Every code block of the README and of the documentation runs, or is checked, offline.

The blocks are read with pytest-codeblocks (``extract_from_file``), which also
reads the marks written as HTML comments above a block
(``<!--pytest.mark.skip(reason="...")-->``,
``<!--pytest-codeblocks:importorskip(detectron2)-->``). The blocks refer to
the files ``detr-peg demo`` writes (``outputs/demo/...``) and to the
repository's ``configs/``; they run in a folder holding a copy of a tiny
demo's output there, with every network connection refused:

* ``python`` blocks run one after the other in one fresh interpreter (each in
  its own namespace; one import of torch instead of one per block, and a block
  repeated on several pages runs once), ``bash`` blocks in bash (with this
  checkout's ``detr-peg``);
* a skipped ``bash`` block (COCO on disk, a GPU, a cluster, an official
  checkpoint) still has its commands checked: each ``detr-peg`` command is
  parsed by the command's own parser, ``train`` runs with ``--print-config``
  and ``study`` with ``--plan``; the scripts and files other commands name
  must exist;
* ``yaml`` and ``json`` blocks must parse;
* the examples of every command's ``--help`` are checked as skipped blocks
  are (``configs`` examples run, since a later example may use their copy).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pytest_codeblocks import extract_from_file

from detr_peg.cli import main as cli
from tests.conftest import REPO_ROOT, python_env

#: The documentation's blocks run as written, commands and Python in their own processes.
pytestmark = pytest.mark.slow

#: Imported by every Python process the blocks start: a block that reaches for the network fails instead of hanging.
OFFLINE = """
import socket
def _refuse(*args, **kwargs):
    raise OSError("network access in a documentation block")
socket.socket.connect = _refuse
socket.create_connection = _refuse
"""

#: The README and the documentation's pages (below docs/results/ only the pages written by hand: the reports are
#: written by tools).
PAGES = [
    REPO_ROOT / "README.md",
    *sorted(
        p for p in (REPO_ROOT / "docs").rglob("*.md") if "results" not in p.parent.relative_to(REPO_ROOT / "docs").parts
    ),
    *(REPO_ROOT / "docs" / "results" / name for name in ("index.md", "notebook.md", "composite.md")),
]


def collect() -> list:
    params = []
    for page in PAGES:
        name = page.relative_to(REPO_ROOT).as_posix()
        for block in extract_from_file(page):
            marks = [eval(mark, {"pytest": pytest}) for mark in block.marks]  # marks written in our own pages
            params.append(pytest.param(name, block, marks=marks, id=f"{name}:{block.lineno}"))
    return params


BLOCKS = collect()
CHECKED = [p for p in BLOCKS if p.values[1].syntax == "bash" and any(m.name == "skip" for m in p.marks)]
RUN = [p for p in BLOCKS if p.values[1].syntax in {"python", "bash", "yaml", "json"}]


def test_the_readme_is_a_front_page_and_its_first_python_block_is_three_lines() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    first = next(b for b in extract_from_file(REPO_ROOT / "README.md") if b.syntax == "python")
    lines = [line for line in first.code.splitlines() if line.strip()]
    assert len(lines) == 3 and lines[0] == "import detr_peg" and "Detector.from_checkpoint" in lines[1]


@pytest.fixture(scope="module")
def workdir(tiny_demo_dir: Path, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("docs")
    shutil.copytree(tiny_demo_dir, folder / "outputs" / "demo", ignore=shutil.ignore_patterns("stdout.txt"))
    (folder / "configs").symlink_to(REPO_ROOT / "configs")
    (folder / "offline").mkdir()
    (folder / "offline" / "sitecustomize.py").write_text(OFFLINE)
    return folder


def block_env(workdir: Path) -> dict[str, str]:
    env = python_env(HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = f"{workdir / 'offline'}:{env['PYTHONPATH']}"
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # this environment's detr-peg first
    return env


#: Runs the Python blocks (a JSON list of [name, code]) and writes each one's traceback, or null, to a JSON file.
RUNNER = """
import contextlib, io, json, sys, traceback
blocks, results = json.load(open(sys.argv[1])), {}
for name, code in blocks:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, name, "exec"), {"__name__": "__main__"})
        results[name] = None
    except BaseException:
        results[name] = traceback.format_exc()[-3000:]
json.dump(results, open(sys.argv[2], "w"))
"""


def missing_module(block) -> str | None:
    """A module the block imports (or its ``importorskip`` names) that is not installed."""
    modules = [block.importorskip] if block.importorskip else []
    if block.syntax == "python":
        modules += re.findall(r"^\s*(?:from|import) (\w+)", block.code, re.M)
    return next((m for m in modules if importlib.util.find_spec(m) is None), None)


@pytest.fixture(scope="module")
def python_results(workdir: Path) -> dict[str, str | None]:
    """Each Python block's traceback (None when it ran), keyed by its code: all blocks run in one interpreter."""
    codes = []
    for param in RUN:
        block = param.values[1]
        runs = not any(m.name == "skip" for m in param.marks) and missing_module(block) is None
        if block.syntax == "python" and runs and block.code not in codes:
            codes.append(block.code)
    (workdir / "blocks.json").write_text(json.dumps([[f"<block {i}>", code] for i, code in enumerate(codes)]))
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, "blocks.json", "results.json"],
        cwd=workdir,
        env=block_env(workdir),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((workdir / "results.json").read_text())
    return {code: results[f"<block {i}>"] for i, code in enumerate(codes)}


@pytest.mark.parametrize(("page", "block"), RUN)
def test_block_runs_as_written(workdir: Path, page: str, block, request) -> None:
    where = f"{page} line {block.lineno}"
    if block.syntax == "yaml":
        yaml.safe_load(block.code)
        return
    if block.syntax == "json":
        json.loads(block.code)
        return
    module = missing_module(block)
    if module is not None:
        pytest.skip(f"the block at {where} needs {module}, which is not installed")
    if block.syntax == "python":
        error = request.getfixturevalue("python_results")[block.code]
        assert error is None, f"{where}:\n{error}"
        return
    command = ["bash", "-euo", "pipefail", "-c", block.code]
    proc = subprocess.run(command, cwd=workdir, env=block_env(workdir), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{where}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


def commands(code: str) -> list[list[str]]:
    """The simple commands of a shell block: continuation lines joined, comments dropped, split at ``&&``."""
    found = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            found.append(words[:cut])
            words = words[cut + 1 :]
    return [c for c in found if c]


def detr_peg_words(words: list[str]) -> list[str] | None:
    """The words after ``detr-peg`` when ``words`` runs the command line (directly, with torchrun or a tools/ script)."""
    name = Path(words[0]).name
    if name == "detr-peg":
        return words[1:]
    if name == "torchrun" and "detr_peg.cli.main" in words:
        return words[words.index("detr_peg.cli.main") + 1 :]
    if name.startswith("python") and len(words) > 1 and words[1] in {"tools/train.py", "tools/study.py"}:
        return [Path(words[1]).stem, *words[2:]]
    return None


def check_detr_peg(words: list[str], capsys, monkeypatch) -> None:
    """Parse ``detr-peg WORDS`` with the command's parser; resolve a training's config, plan a study."""
    name, rest = words[0], words[1:]
    parser, module = cli.command_parser(name)
    try:
        cli.parse_command(parser, module, rest)
    except SystemExit as exc:
        pytest.fail(f"detr-peg {shlex.join(words)}: {capsys.readouterr().err.strip()} (exit {exc.code})")
    extra = {"train": "--print-config", "study": "--plan"}.get(name)
    if extra is not None:
        monkeypatch.setattr(cli, "retain_freed_memory", lambda: None)  # a setting for commands, not for the tests
        status = cli.main([name, *rest, *([extra] if extra not in rest else [])])
        assert status == 0, f"detr-peg {shlex.join(words)} {extra}: {capsys.readouterr().err.strip()}"
        capsys.readouterr()


def is_set_up(words: list[str]) -> bool:
    """A set-up command of the README's two commands, or ``git``/``mkdocs``: what a skipped block may leave unchecked."""
    program = Path(words[0]).name
    return (
        words[:3] == ["python3", "-m", "venv"]
        or program in {"pip", "ruff", "lint-imports", "git", "mkdocs"}
        or (program == "python" and words[1:3] == ["-m", "pytest"])
    )


@pytest.mark.parametrize(("page", "block"), [pytest.param(*p.values, id=p.id) for p in CHECKED])
def test_skipped_shell_block_is_checked(workdir: Path, page: str, block, capsys, monkeypatch) -> None:
    monkeypatch.chdir(workdir)
    for words in commands(block.code):
        sub = detr_peg_words(words)
        if sub is not None:
            check_detr_peg(sub, capsys, monkeypatch)
        elif Path(words[0]).name.startswith("python") and words[1:2] and words[1].endswith(".py"):
            assert (REPO_ROOT / words[1]).is_file(), f"{page} line {block.lineno}: no {words[1]}"
            for config in [w for w in words if w.startswith("configs/")]:
                assert (REPO_ROOT / config).is_file(), f"{page} line {block.lineno}: no {config}"
        elif words[0] == "pytest":
            assert (REPO_ROOT / words[1]).is_file(), f"{page} line {block.lineno}: no {words[1]}"
        else:  # set-up commands (venv, pip, git clone, the linters, mkdocs) are not run, nor checked
            assert is_set_up(words), f"{page} line {block.lineno}: nothing checks `{shlex.join(words)}`"


def help_examples() -> list:
    """Each command's ``detr-peg ...`` example lines of its ``--help`` (continuation lines joined), in order."""
    found = []
    for name, (module_name, _) in cli.COMMANDS.items():
        text = (importlib.import_module(module_name).__doc__ or "").replace("\\\n", " ")
        lines = [line.strip() for line in text.splitlines() if line.strip().startswith("detr-peg ")]
        if lines:
            found.append(pytest.param(lines, id=name))
    return found


@pytest.mark.parametrize("lines", help_examples())
def test_help_examples_are_checked(workdir: Path, lines: list[str], tmp_path: Path, capsys, monkeypatch) -> None:
    """What a user copies from ``--help`` parses; a training resolves its config and a study plans.

    ``configs`` commands run for real (they list or copy a shipped config, which a later example may use), in
    a folder of their own.
    """
    monkeypatch.chdir(workdir)
    for line in lines:
        words = detr_peg_words(shlex.split(line, comments=True))
        if words[0] == "configs":
            monkeypatch.chdir(tmp_path)
            assert cli.main(words) == 0, f"detr-peg {line}: {capsys.readouterr().err.strip()}"
            capsys.readouterr()
        else:
            check_detr_peg(words, capsys, monkeypatch)
