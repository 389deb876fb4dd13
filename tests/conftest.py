"""Shared test fixtures.

Tests that need the reference fixtures or the coco128 images look for them in
``../shared`` next to the repository (or in ``$DETR_PEG_SHARED``) and skip with
a reason when they are absent.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import detr_peg.models  # noqa: F401  (registers the architectures and encodings configs are checked against)
from tests.cli_process import CliResult, CliRunner, checkout_pythonpath
from tests.engine.tiny_run import RUN, TINY_MODEL, data_overrides

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = Path(os.environ.get("DETR_PEG_SHARED", REPO_ROOT.parent / "shared"))
REFERENCE_DIR = SHARED_DIR / "reference"
COCO128_DIR = SHARED_DIR / "data" / "coco128"

#: Tests run in this many processes (``pytest -n N``, pytest-xdist); each takes its share of the cores, and the
#: commands its tests start inherit it, so N workers never run more threads than there are cores.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // WORKERS))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
else:
    torch.set_num_threads(min(2, torch.get_num_threads()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules with a ``slow`` test run first, the rest in their usual order.

    The workers (``-n auto --dist loadscope``) take whole modules in collection order; a long module taken
    last keeps one worker busy while the other has nothing left, so the long ones go first and the many short
    ones fill the end.
    """
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: each group keeps its order


def python_env(**extra: str) -> dict[str, str]:
    """The environment of a Python subprocess that imports this checkout's ``detr_peg``."""
    return {
        **os.environ,
        "PYTHONPATH": checkout_pythonpath(),
        **extra,
    }


#: ``python -m detr_peg.cli.main``: what :func:`run_python` runs through the warm command runner.
CLI = ("-m", "detr_peg.cli.main")
_cli_runner: CliRunner | None = None


def cli_runner() -> CliRunner:
    """The command runner of this test process (warm, see :class:`tests.cli_process.CliRunner`), started once."""
    global _cli_runner
    if _cli_runner is None:
        _cli_runner = CliRunner()
        atexit.register(_cli_runner.close)
    return _cli_runner


def run_python(*args: str, cwd: Path = REPO_ROOT, timeout: int = 600, fresh: bool = False, **env: str) -> CliResult:
    """``python ARGS`` in its own process (this checkout's ``detr_peg``), output captured as text.

    ``python -m detr_peg.cli.main ...`` and ``python tools/SCRIPT.py ...`` without extra
    environment variables run in a process forked from a helper that has imported
    torch and the commands once (:class:`tests.cli_process.CliRunner`, one per test
    process, single-threaded as its commands are): the same command line, exit status
    and output as a fresh interpreter, without the seconds of start-up. Everything
    else (``-c CODE``, other scripts), every command with ``env``, and every command
    with ``fresh=True`` (a test of what runs while the modules are imported) starts a
    fresh interpreter.
    """
    tool = bool(args) and args[0].startswith("tools/") and args[0].endswith(".py")
    if (args[:2] == CLI or tool) and not env and not fresh:
        if tool:
            return cli_runner().run(args[1:], cwd=cwd, timeout=timeout, script=args[0])
        return cli_runner().run(args[2:], cwd=cwd, timeout=timeout)
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=python_env(**env), capture_output=True, text=True, timeout=timeout
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr, "cold")


#: ``main(ARGV)`` of the command line, then a JSON line: its exit status and the torch and model modules loaded.
_FRESH_MAIN = """
import json, sys
from detr_peg.cli.main import main
status = main(sys.argv[1:])
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "detr_peg.models")))
print(json.dumps({"status": status, "heavy": heavy}))
"""


def main_in_fresh_interpreter(*argv: str, cwd: Path = REPO_ROOT, timeout: int = 120) -> tuple[CliResult, dict]:
    """``detr-peg ARGV`` through ``main`` in a fresh interpreter (nothing imported before it).

    Returns:
        The process's result, its stdout without the last line, and ``{"status": exit status, "heavy":
        the torch and detr_peg.models modules it imported}`` read from that line.
    """
    proc = run_python("-c", _FRESH_MAIN, *argv, cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *lines, last = proc.stdout.splitlines()
    return CliResult(proc.returncode, "".join(line + "\n" for line in lines), proc.stderr, proc.mode), json.loads(last)


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """The official-code fixtures (``shared/reference``); skips when absent."""
    if not (REFERENCE_DIR / "README.md").is_file():
        pytest.skip(f"reference fixtures not found at {REFERENCE_DIR} (set DETR_PEG_SHARED)")
    return REFERENCE_DIR


@pytest.fixture(scope="session")
def coco128_dir() -> Path:
    """128 real COCO images with annotations (``shared/data/coco128``); skips when absent."""
    if not (COCO128_DIR / "annotations.json").is_file():
        pytest.skip(f"coco128 not found at {COCO128_DIR} (set DETR_PEG_SHARED)")
    return COCO128_DIR


COCO128_SMALL = [
    "model.backbone.out_stages=[2]",
    "data.train_scales=[96]",
    "data.train_max_size=128",
    "data.crop_scales=[96]",
    "data.crop_size=[64,96]",
    "data.val_scale=96",
    "data.val_max_size=128",
]


@pytest.fixture(scope="session")
def coco128_checkpoint(coco128_dir: Path, tmp_path_factory) -> Path:
    """A tiny DETR trained for 3 iterations on coco128 by `detr-peg train` in a subprocess; its checkpoint."""
    out = tmp_path_factory.mktemp("coco128_run")
    args = [
        *TINY_MODEL,
        *COCO128_SMALL,
        *RUN,
        "data.num_workers=2",
        "train.batch_size=2",
        "train.max_iters=3",
        "train.tensorboard=true",
        *data_overrides(
            coco128_dir / "images",
            coco128_dir / "annotations_train.json",
            coco128_dir / "images",
            coco128_dir / "annotations_val.json",
        ),
    ]
    proc = run_python(*CLI, "train", "--output", str(out), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "AP50" in proc.stdout and "Done: 3 iterations" in proc.stdout
    return out / "checkpoint.pth"


# Score threshold 0: every detection is drawn and listed, so predictions.json is never empty.
TINY_DEMO = [
    "--num-train",
    "8",
    "--num-val",
    "4",
    "--pictures",
    "3",
    *TINY_MODEL,
    "train.max_iters=2",
    "train.batch_size=4",
    "eval.batch_size=4",
    "eval.score_threshold=0.0",
]


@pytest.fixture(scope="session")
def tiny_demo_dir(tmp_path_factory) -> Path:
    """`detr-peg demo` with a tiny model, 8 + 4 images and 2 iterations, run in a subprocess; its folder."""
    out = tmp_path_factory.mktemp("demo")
    # From another folder: the default config is found through the package, not the working directory.
    proc = run_python(*CLI, "demo", "--output", str(out), *TINY_DEMO, cwd=out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (out / "stdout.txt").write_text(proc.stdout)
    return out


def without_option(args: list[str], option: str) -> list[str]:
    """``args`` without ``option`` and its value (the command line refuses an option given twice)."""
    return [word for i, word in enumerate(args) if word != option and args[i - 1 : i] != [option]]
