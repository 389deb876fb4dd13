"""One command per output folder, with real processes: the second stops at once naming the first, the first's
files stay whole, and a killed holder blocks nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from detr_peg.checkpoint.format import read_checkpoint
from detr_peg.outputs import HOLDER_FILE, LOCK_FILE, FolderInUse, Output, folder_lock, guard_outputs, holder_alive
from tests.conftest import REPO_ROOT, python_env, run_python
from tests.engine.tiny_run import synthetic_data, synthetic_overrides

HOLD = """
import sys, time
from pathlib import Path
from detr_peg.outputs import Output, guard_outputs
with guard_outputs("train", [], [Output(Path(sys.argv[1]), "--output", ("metrics.json",))]):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _wait_for(path: Path, timeout: float = 120, text: str = "") -> None:
    """Until ``path`` exists (and holds ``text``)."""
    end = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < end, f"{path} never appeared" + (f" with {text!r}" if text else "")
        time.sleep(0.05)


def _holder(folder: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder), str(seconds)], env=python_env(), stdout=subprocess.PIPE
    )
    assert proc.stdout.readline().strip() == b"held"
    return proc


def test_a_second_command_on_a_held_folder_names_the_holder(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    holder = _holder(folder, 30)
    try:
        with pytest.raises(FolderInUse) as refused:
            guard_outputs("eval", [], [Output(folder, "--output", ("metrics.json",))])
        message = str(refused.value)
        assert f"--output {folder} is in use by detr-peg train (process {holder.pid} on " in message
        assert "\n" not in message
        # a file output locks its folder too
        with pytest.raises(FolderInUse, match="in use by detr-peg train"):
            guard_outputs("export", [], [Output(folder / "model.onnx", "--output")])
    finally:
        holder.terminate()
        holder.wait()
    # the holder ended (SIGTERM): the folder is free, and as it left it
    with guard_outputs("eval", [], [Output(folder, "--output", ("metrics.json",))]):
        assert json.loads((folder / HOLDER_FILE).read_text())["pid"] == os.getpid()


def _blocked(signum: int, frame: object) -> None:
    raise TimeoutError("reading the holder file blocked")


def _valid_holder(**fields) -> str:
    return json.dumps({"pid": 1, "host": "elsewhere", "command": "train", "since": "now", **fields})


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: os.mkfifo(p), id="a FIFO (a plain read would block)"),
        pytest.param(lambda p: p.write_text(_valid_holder(since="x" * 70_000)), id="well formed, over 64 KiB"),
        pytest.param(lambda p: p.write_text(_valid_holder(pid="12")), id="pid text"),
        pytest.param(lambda p: p.write_text(_valid_holder(pid=2**40)), id="pid beyond any process id"),
        pytest.param(lambda p: p.write_text("[1, 2]"), id="a list"),
        pytest.param(lambda p: p.write_bytes(b"\xff\xfe"), id="not UTF-8"),
    ],
)
def test_a_damaged_holder_description_is_read_bounded_and_not_named(tmp_path: Path, damage) -> None:
    """The description is for messages only: a damaged one gives the general message at once, never an error."""
    folder = tmp_path / "run"
    holder = _holder(folder, 60)
    previous = signal.signal(signal.SIGALRM, _blocked)
    signal.alarm(30)
    try:
        assert holder_alive(folder) is True
        (folder / HOLDER_FILE).unlink()
        damage(folder / HOLDER_FILE)
        assert holder_alive(folder) is None
        with pytest.raises(FolderInUse) as refused:
            guard_outputs("eval", [], [Output(folder, "--output", ("metrics.json",))])
        assert str(refused.value) == (
            f"--output {folder} is in use by another detr-peg command; wait for it to end, or stop it, "
            "or choose another --output."
        )
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        holder.terminate()
        holder.wait()


def test_a_killed_holder_blocks_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    holder = _holder(folder, 60)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (folder / LOCK_FILE).exists()  # left behind by the killed process, and harmless
    with guard_outputs("train", [], [Output(folder, "--output", ("metrics.json",))]):
        pass


def test_the_lock_is_reentrant_in_one_process_and_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    folder = tmp_path / "demo" / "run"
    with folder_lock(folder, "demo", "--output"):
        with folder_lock(folder, "train", "train.output_dir"):  # the demo's training run, in the same process
            assert json.loads((folder / HOLDER_FILE).read_text())["command"] == "demo"
        assert (folder / HOLDER_FILE).exists()  # still held by the outer one
    assert not folder.exists()  # created for the lock, nothing written: gone again
    folder.mkdir(parents=True)
    (folder / "mine.txt").write_text("x")
    with guard_outputs("train", [], [Output(folder, "--output", ("metrics.json",))]):
        pass
    assert sorted(p.name for p in folder.iterdir()) == ["mine.txt"]


@pytest.mark.slow
def test_two_trainings_into_one_folder_one_runs_the_other_exits_2(tmp_path: Path) -> None:
    """The first training runs until the second has been refused (however slowly it starts on a busy
    machine), then is stopped with SIGINT: its files are those of one run, whole."""
    data = synthetic_data(tmp_path / "data", num_train=8, num_val=2)
    out = tmp_path / "run"
    args = [sys.executable, "-m", "detr_peg.cli.main", "train",
            *synthetic_overrides(data, out, "train.max_iters=100000", "train.batch_size=2")]  # fmt: skip
    first = subprocess.Popen(
        args, env=python_env(), cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for(out / HOLDER_FILE)
        second = run_python(*args[1:], timeout=300)
        assert first.poll() is None, "the first training ended before the second was refused"
        _wait_for(out / "metrics.jsonl", text='"type": "iter"')  # a refusal can come before the first iteration
        first.send_signal(signal.SIGINT)
    except BaseException:
        first.kill()  # a failure above must not leave a training of 100000 iterations running
        first.communicate()
        raise
    stdout, stderr = first.communicate(timeout=600)
    assert second.returncode == 2, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and f"is in use by detr-peg train (process {first.pid} on " in lines[0]
    assert first.returncode == 130, stderr[-2000:]  # stopped by SIGINT after its checkpoint
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["type"] for r in records].count("start") == 1
    iterations = [r["iteration"] for r in records if r["type"] == "iter"]  # train.log_every=1
    assert iterations == list(range(1, len(iterations) + 1)) and iterations
    assert read_checkpoint(out / "checkpoint.pth").extra["iteration"] == iterations[-1]
    assert not (out / HOLDER_FILE).exists() and not (out / LOCK_FILE).exists()
