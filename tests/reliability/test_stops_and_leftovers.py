"""Rules: a stop by SIGTERM outside training is one line and exit 143; a killed command's staging goes at the
next start; ``plot`` refuses a log it cannot draw anything from.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.conftest import (
    IMAGES,
    OUT,
    RESUME,
    assert_one_line_error,
    assert_outputs_kept,
    assert_success,
    snapshot,
)


def _many_images(case: Path, copies: int = 50) -> Path:
    folder = case / "many"
    folder.mkdir()
    for i in range(copies):
        for image in sorted((case / IMAGES).iterdir()):
            shutil.copy(image, folder / f"{i:03d}_{image.name}")
    return folder


def _wait_for(condition, proc, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() or time.monotonic() > deadline:
            if not proc.poll():
                proc.send_signal(signal.SIGKILL)
            result = proc.wait()
            raise AssertionError(f"the command ended before the awaited moment: {result.returncode} {result.stderr}")
        time.sleep(0.01)


def test_sigterm_while_predicting_is_one_line_and_publishes_nothing(cli, case: Path) -> None:
    """Inside the inference loop (pictures staged): exit 143, one line, no picture published, no staging left."""
    many = _many_images(case)
    proc = cli.start(["predict", "--checkpoint", OUT / "checkpoint.pth", many, "--output", "pred"], cwd=case)
    _wait_for(lambda: any(p.is_dir() and any(p.iterdir()) for p in (case / "pred").glob(".predict-tmp-*")), proc)
    proc.send_signal(signal.SIGTERM)
    result = proc.wait()
    assert_one_line_error(result, "stopped by SIGTERM", returncode=143)
    left = sorted(p.name for p in (case / "pred").iterdir()) if (case / "pred").exists() else []
    assert not [name for name in left if name.endswith(".png") or name.startswith((".predict-tmp-", "predictions"))]


@pytest.mark.parametrize("moment_s", [0.2, 0.6, 1.2])
def test_sigterm_at_any_moment_of_an_evaluation_is_one_line(cli, case: Path, moment_s: float) -> None:
    """Start-up, data loading, inference or writing: whatever the moment, one line and 143 (or success)."""
    before = snapshot(case / OUT)
    proc = cli.start(["eval", "--checkpoint", OUT / "checkpoint.pth", "--output", "ev"], cwd=case)
    time.sleep(moment_s)
    proc.send_signal(signal.SIGTERM)
    result = proc.wait()
    metrics = case / "ev" / "metrics.json"
    if result.returncode == -signal.SIGTERM and result.stdout:
        # The command had returned and the interpreter was exiting: its files are complete.
        assert "Wrote " in result.stdout and json.loads(metrics.read_text())["unit"] == "percent"
    elif result.returncode == -signal.SIGTERM:
        # The signal came before the command's first line (the interpreter was starting): it wrote nothing.
        assert result.stderr == "" and not (case / "ev").exists()
    elif result.returncode != 0:  # it may have finished before the signal
        assert_one_line_error(result, "stopped by SIGTERM", returncode=143)
        assert not metrics.exists() or json.loads(metrics.read_text())
    assert not [p for p in case.rglob("*") if ".tmp-" in p.name]
    assert_outputs_kept(before, case / OUT)


def test_the_staging_of_a_killed_predict_goes_at_the_next_start(cli, case: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # a process that has ended
    stage = case / OUT / "predictions" / f".predict-tmp-{pid}"
    stage.mkdir()
    (stage / "img0.png").write_bytes(b"half a picture")
    mine = case / OUT / "predictions" / f".predict-tmp-{os.getpid()}"  # a live process's staging stays
    mine.mkdir()
    result = cli.run(
        ["predict", "--checkpoint", OUT / "checkpoint.pth", IMAGES, "--output", OUT / "predictions"], cwd=case
    )
    assert result.returncode == 0, result.stderr
    assert not stage.exists()
    assert mine.is_dir()


def test_a_resumed_run_removes_only_the_temporaries_of_gone_processes(cli, case: Path) -> None:
    """``.checkpoint.pth.tmp-<pid>`` of a killed run goes; a live process's, and files of the user's, stay."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = case / OUT / f".checkpoint.pth.tmp-{int(dead.stdout)}"
    kept = [case / OUT / f".checkpoint.pth.tmp-{os.getpid()}", case / OUT / "checkpoint.pth.tmp",
            case / OUT / ".config.yaml.tmp-mine", case / OUT / "detections.json.tmp"]  # fmt: skip
    for path in (stale, *kept):
        path.write_bytes(b"half a file")
    assert_success(cli.run(RESUME, cwd=case))
    assert not stale.exists() and all(path.read_bytes() == b"half a file" for path in kept)


GARBAGE_LOGS = {
    "empty": "",
    "blank lines": "\n\n\n",
    "not JSON": "this is not json\n{broken\n",
    "JSON that is not a record": '[1, 2]\n3\n"text"\nnull\n',
    "records without numbers": '{"type": "iter", "iteration": 1, "loss": "high"}\n{"type": "eval", "AP": null}\n',
    "non-finite numbers": '{"type": "iter", "iteration": 1, "loss": NaN}\n{"type": "iter", "iteration": 2, "loss": Infinity}\n',
    "only a start record": '{"type": "start", "iteration": 0}\n',
}


@pytest.mark.parametrize("content", list(GARBAGE_LOGS))
def test_plot_refuses_a_log_with_no_usable_record(cli, case: Path, content: str) -> None:
    run = case / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(GARBAGE_LOGS[content])
    before = snapshot(run)
    result = cli.run(["plot", "run"], cwd=case)
    assert_one_line_error(result, "metrics.jsonl", "no usable record")
    assert_outputs_kept(before, run)
    assert not (run / "plots").exists()


def test_plot_draws_a_log_with_one_usable_record_among_garbage(cli, case: Path) -> None:
    run = case / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("garbage\n[1]\n" + '{"type": "iter", "iteration": 1, "loss": 2.5}\n')
    result = cli.run(["plot", "run"], cwd=case)
    assert result.returncode == 0, result.stderr
    assert (run / "plots" / "learning_curve.png").stat().st_size > 1000


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """``detr-peg configs list | head -1``: no traceback, the status of a broken pipe (141).

    The reader is gone before the command writes (its end of the pipe is closed first): a reader that reads
    one line and then leaves races with a command whose whole output fits in the pipe's buffer.
    """
    from tests.conftest import python_env

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from detr_peg.cli.main import main; sys.exit(main(['configs', 'list']))",
            ],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=python_env(),
            cwd=tmp_path,
        )
    finally:
        os.close(write_end)
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, stderr
    assert "Traceback" not in stderr and stderr == "", stderr


DEMO_DATA = ["demo", "--data-only", "--num-train", "2", "--num-val", "1", "--output", "d"]


@pytest.mark.parametrize("stream", ["full", "closed", "closed-stderr"])
@pytest.mark.parametrize(
    "args", [["configs", "list"], ["configs", "copy", "demo", "mine.yaml"], DEMO_DATA], ids=["list", "copy", "demo"]
)
def test_a_full_or_closed_standard_output_ends_without_a_traceback(tmp_path: Path, stream: str, args) -> None:
    """``> /dev/full``: one line and exit 2, the files written complete; ``>&-`` or ``2>&-``: what would be printed
    there goes nowhere, and the command runs as usual (its messages go through the logger too)."""
    from tests.conftest import REPO_ROOT, python_env

    code = f"import sys; from detr_peg.cli.main import main; sys.exit(main({args!r}))"
    closed = {"closed": 1, "closed-stderr": 2}.get(stream)
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            stdout=full if stream == "full" else subprocess.PIPE,
            preexec_fn=(lambda: os.close(closed)) if closed else None,
            stderr=None if stream == "closed-stderr" else subprocess.PIPE,
            env=python_env(),
            cwd=tmp_path,
            timeout=120,
        )
    stderr = (proc.stderr or b"").decode()
    if stream == "full":
        assert proc.returncode == 2, stderr
        assert stderr.splitlines() == [
            f"detr-peg {args[0]}: error: standard output cannot be written (No space left on device); "
            "the files the command finished are complete."
        ]
    else:
        assert (proc.returncode, stderr) == (0, ""), stderr
    if args[1] == "copy":
        shipped = (REPO_ROOT / "configs" / "demo.yaml").read_text()
        assert (tmp_path / "mine.yaml").read_text() == shipped
    if args[0] == "demo" and stream != "full":  # a full stdout stops it at its first message
        assert len(json.loads((tmp_path / "d" / "data" / "annotations_train.json").read_text())["images"]) == 2


def test_a_name_that_standard_output_cannot_encode_prints_escaped(tmp_path: Path) -> None:
    """``PYTHONIOENCODING=ascii``: "é" in a printed path comes out as ``\\xe9``, the command succeeds."""
    from tests.conftest import REPO_ROOT, run_python

    args = ("-m", "detr_peg.cli.main", "configs", "copy", "demo", "démo.yaml")
    proc = run_python(*args, cwd=tmp_path, PYTHONIOENCODING="ascii")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["configs: wrote d\\xe9mo.yaml", "configs: use it with --config d\\xe9mo.yaml"]
    assert (tmp_path / "démo.yaml").read_text() == (REPO_ROOT / "configs" / "demo.yaml").read_text()


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_an_evaluation_runs_as_usual_with_a_stream_of_none(tiny_demo_dir: Path, tmp_path, monkeypatch, stream) -> None:
    """``sys.stdout`` / ``sys.stderr`` are None under ``pythonw`` or ``>&-``: the command line and the API run."""
    from detr_peg import Detector
    from detr_peg.cli.main import main

    checkpoint, data = tiny_demo_dir / "run" / "checkpoint.pth", tiny_demo_dir / "data"
    monkeypatch.setattr(sys, stream, None)
    assert main(["eval", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "eval")]) == 0
    assert getattr(sys, stream) is None
    written = json.loads((tmp_path / "eval" / "metrics.json").read_text())["bbox"]
    detector = Detector.from_checkpoint(checkpoint, device="cpu")
    assert detector.evaluate(data / "val", data / "annotations_val.json") == pytest.approx(written, abs=1e-12)
