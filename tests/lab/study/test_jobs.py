"""``detr-peg study --jobs N``: cells side by side, each in its own process.

* the cores are shared out as torch threads;
* two cells with ``--jobs 2`` run at the same time, each in a process of its
  own (each cell's command waits until the other's has started);
* a 2-setting study with ``--jobs 2`` ends with exactly the weights and tables
  of the same study run one cell after the other (``--jobs 1``, one thread as
  well);
* SIGINT to the study while both cells train stops every cell still running
  after a checkpoint (exit 130, those cells ``interrupted``; a cell that had
  already finished stays ``done``), and the same command resumes them to the
  end;
* ``--jobs`` with cluster jobs is refused.
"""

from __future__ import annotations

import json
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from detr_peg.checkpoint.format import read_checkpoint
from detr_peg.cli.main import main
from detr_peg.lab.study.grid import EvalPlan, StudyDefinition, expand_cells, parse_axis
from detr_peg.lab.study.parallel import _cell_context, run_parallel, threads_per_job
from detr_peg.lab.study.runner import describe
from detr_peg.outputs import HOLDER_FILE
from tests.conftest import python_env
from tests.lab.study.conftest import tiny_overrides, write_base_config

pytestmark = pytest.mark.slow  # real training runs in processes of their own

GRID = ["--grid", "model.position.name=sine,peg"]
CELLS = ["position.name=sine_seed0", "position.name=peg_seed0"]


@pytest.mark.parametrize(("jobs", "cores", "threads"), [(1, 2, 2), (2, 2, 1), (4, 2, 1), (3, 16, 5)])
def test_each_job_gets_its_share_of_the_cores(jobs: int, cores: int, threads: int) -> None:
    assert threads_per_job(jobs, cores) == threads


def _records(cell: Path) -> list[dict]:
    return [json.loads(line) for line in (cell / "run" / "metrics.jsonl").read_text().splitlines()]


def _meet(argv: list[str], log: Path) -> tuple[int, str | None]:
    """A cell's command that only returns once the other cell's command has started too (or fails after 120 s)."""
    here = log.parent
    (here / "started").write_text(str(os.getpid()))
    others = [p for p in here.parent.iterdir() if p != here]
    deadline = time.monotonic() + 120
    while not all((o / "started").is_file() for o in others):
        if time.monotonic() > deadline:
            return 1, "the other cell never started while this one ran"
        time.sleep(0.05)
    return 0, None


def test_two_jobs_run_at_the_same_time_each_in_its_own_process(tmp_path: Path) -> None:
    """Each cell's command waits for the other's start: only cells that run together both finish."""
    base = write_base_config(tmp_path / "base.yaml")
    cells = expand_cells(StudyDefinition(configs=(str(base),), axes=(parse_axis("model.position.name=sine,peg"),)))
    outcomes, signum = run_parallel(tmp_path / "study", cells, EvalPlan(), _meet, jobs=2, describe=describe)
    assert signum is None
    assert sorted((o.name, o.status) for o in outcomes) == sorted((name, "done") for name in CELLS)
    pids = {int((tmp_path / "study" / "cells" / name / "started").read_text()) for name in CELLS}
    assert len(pids) == 2 and os.getpid() not in pids  # a process of its own per cell


def test_two_jobs_give_the_results_of_one_job(tmp_path: Path, shapes) -> None:
    base = write_base_config(tmp_path / "base.yaml")
    # One thread per cell in both studies (2 jobs on 2 cores; this process is single-threaded in tests),
    # so the float sums are split the same way and the weights can be compared exactly.
    studies = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        argv = ["study", "--config", str(base), *GRID, "--output", str(out), "--jobs", str(jobs)]
        assert main([*argv, *tiny_overrides(shapes), "train.max_iters=6"]) == 0
        studies[jobs] = out
    if threads_per_job(2) != 1:
        pytest.skip("the exact comparison needs one thread per cell (a machine of 2 or 3 cores)")
    for name in CELLS:
        one, two = (studies[j] / "cells" / name for j in (1, 2))
        a = read_checkpoint(one / "run" / "checkpoint.pth").model
        b = read_checkpoint(two / "run" / "checkpoint.pth").model
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    tables = [json.loads((studies[j] / "study.json").read_text())["settings"] for j in (1, 2)]
    assert [s["main"]["AP"] for s in tables[0]] == [s["main"]["AP"] for s in tables[1]]


def test_ctrl_c_stops_every_running_cell_after_a_checkpoint_and_the_study_resumes(tmp_path: Path, shapes) -> None:
    """Ctrl-C signals the study's whole process group (its fork server included); the cells left it."""
    base = write_base_config(tmp_path / "base.yaml")
    out = tmp_path / "study"
    argv = [
        sys.executable, "-m", "detr_peg.cli.main", "study", "--config", str(base), *GRID, "--output", str(out),
        "--jobs", "2", *tiny_overrides(shapes), "train.max_iters=60", "train.eval_every_iters=0",
        "train.checkpoint_every=1",
    ]  # fmt: skip
    # In a process group of its own, as a command started from a terminal: Ctrl-C signals the whole group.
    proc = subprocess.Popen(
        argv, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        cells = [out / "cells" / name for name in CELLS]

        def training() -> bool:
            logs = [c / "run" / "metrics.jsonl" for c in cells]
            return all(p.is_file() and '"type": "iter"' in p.read_text() for p in logs)

        while not training():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the cells did not start training"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The study ends after its cells: none still holds its run folder (a training removes the holder file last).
    assert [c.name for c in cells if (c / "run" / HOLDER_FILE).exists()] == []
    assert proc.returncode == 130, stderr
    assert "run the same command again to resume" in stderr
    # Every cell still running at the signal stops after a checkpoint; on a loaded machine one cell
    # may have finished before the other logged its first iteration, and that one stays done.
    states = {cell: json.loads((cell / "cell.json").read_text())["status"] for cell in cells}
    assert set(states.values()) <= {"interrupted", "done"} and "interrupted" in states.values(), states
    for cell in (c for c, status in states.items() if status == "interrupted"):
        # at most 60: a signal just after the training's last iteration stops the cell before it is recorded done
        stopped_at = read_checkpoint(cell / "run" / "checkpoint.pth").extra["iteration"]
        assert 0 < stopped_at <= 60
    resumed = subprocess.run(argv, env=python_env(), capture_output=True, text=True, timeout=600)  # the same command
    assert resumed.returncode == 0, resumed.stderr
    for cell in cells:
        assert json.loads((cell / "cell.json").read_text())["status"] == "done"
        starts = [r for r in _records(cell) if r["type"] == "start"]
        assert starts[0]["resumed_iteration"] == 0
        if states[cell] == "interrupted":
            assert len(starts) == 2 and starts[-1]["resumed_iteration"] > 0
        else:
            assert len(starts) == 1  # a finished cell is not trained again


def test_jobs_with_cluster_jobs_is_refused(tmp_path: Path, capsys) -> None:
    base = write_base_config(tmp_path / "base.yaml")
    argv = ["study", "--config", str(base), *GRID, "--output", str(tmp_path / "s"), "--jobs", "2", "--submitit-local"]
    assert main(argv) == 2
    assert "--jobs runs cells on this machine" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the cells are forked from a fork server on Linux only"
)
def test_the_fork_server_outlives_a_sigterm_to_the_group() -> None:
    """``timeout`` or ``kill -- -PGID`` reaches the fork server too: it must live on, since the study starts the
    cells through it and sees them end through it (were it gone, every running cell would look finished)."""
    context = _cell_context()
    pid = multiprocessing.forkserver._forkserver._forkserver_pid  # the server of this process (private name)
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.5)
    assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # still running
    cell = context.Process(target=time.sleep, args=(0,))
    cell.start()
    cell.join(60)
    assert cell.exitcode == 0


def test_a_second_study_into_a_running_studys_folder_exits_2_at_once(tmp_path: Path, shapes) -> None:
    """The rule of one command per output folder holds for studies: the second one neither waits nor runs cells."""
    base = write_base_config(tmp_path / "base.yaml")
    out = tmp_path / "study"
    argv = [
        sys.executable, "-m", "detr_peg.cli.main", "study", "--config", str(base), *GRID, "--output", str(out),
        *tiny_overrides(shapes), "train.max_iters=100000", "train.epochs=100000", "train.eval_every_iters=0",
    ]  # fmt: skip
    first = subprocess.Popen(
        argv, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        while not (out / "cells" / CELLS[0] / "run" / "metrics.jsonl").is_file():  # the first cell trains
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first study did not start its cell"
            time.sleep(0.2)
        started = time.monotonic()
        second = subprocess.run(argv, env=python_env(), capture_output=True, text=True, timeout=120)
        assert time.monotonic() - started < 60  # at once: no wait for the first study's cells
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.communicate(timeout=180)
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1, second.stderr
    assert lines[0].startswith(
        f"detr-peg study: error: --output {out} is in use by detr-peg study (process {first.pid}"
    )
