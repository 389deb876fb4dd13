"""``detr-peg study --jobs N``: cells side by side, each in its own process.

* the cores are shared out as torch threads;
* a 2-setting study with ``--jobs 2`` runs both cells at the same time (their
  training times overlap) and ends with exactly the weights and tables of the
  same study run one cell after the other (``--jobs 1``, one thread as well);
* SIGINT to the study while both cells train stops both after a checkpoint
  (exit 130, the cells ``interrupted``), and the same command resumes them to
  the end;
* ``--jobs`` with cluster jobs is refused.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from detr_peg.checkpoint.format import read_checkpoint
from detr_peg.cli.main import main
from detr_peg.study.parallel import threads_per_job
from tests.conftest import python_env
from tests.study.conftest import tiny_overrides, write_base_config

pytestmark = pytest.mark.slow  # real training runs in spawned processes

GRID = ["--grid", "model.position.name=sine,peg"]
CELLS = ["position.name=sine_seed0", "position.name=peg_seed0"]


@pytest.mark.parametrize(("jobs", "cores", "threads"), [(1, 2, 2), (2, 2, 1), (4, 2, 1), (3, 16, 5)])
def test_each_job_gets_its_share_of_the_cores(jobs: int, cores: int, threads: int) -> None:
    assert threads_per_job(jobs, cores) == threads


def _records(cell: Path) -> list[dict]:
    return [json.loads(line) for line in (cell / "run" / "metrics.jsonl").read_text().splitlines()]


def test_two_jobs_overlap_and_give_the_results_of_one_job(tmp_path: Path, shapes) -> None:
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
    spans = []
    for name in CELLS:
        one, two = (studies[j] / "cells" / name for j in (1, 2))
        a = read_checkpoint(one / "run" / "checkpoint.pth").model
        b = read_checkpoint(two / "run" / "checkpoint.pth").model
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
        times = [r["time"] for r in _records(two) if r["type"] in ("start", "end")]
        spans.append((min(times), max(times)))
    (start_a, end_a), (start_b, end_b) = spans
    assert start_a < end_b and start_b < end_a  # the two cells trained at the same time
    tables = [json.loads((studies[j] / "study.json").read_text())["settings"] for j in (1, 2)]
    assert [s["main"]["AP"] for s in tables[0]] == [s["main"]["AP"] for s in tables[1]]


def test_sigint_stops_every_running_cell_after_a_checkpoint_and_the_study_resumes(tmp_path: Path, shapes) -> None:
    base = write_base_config(tmp_path / "base.yaml")
    out = tmp_path / "study"
    argv = [
        sys.executable, "-m", "detr_peg.cli.main", "study", "--config", str(base), *GRID, "--output", str(out),
        "--jobs", "2", *tiny_overrides(shapes), "train.max_iters=30", "train.eval_every_iters=0",
        "train.checkpoint_every=1",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
        proc.send_signal(signal.SIGINT)  # to the study only, as Ctrl-C reaches it (the cells left its group)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "run the same command again to resume" in stderr
    for cell in cells:
        state = json.loads((cell / "cell.json").read_text())
        assert state["status"] == "interrupted", state
        stopped_at = read_checkpoint(cell / "run" / "checkpoint.pth").extra["iteration"]
        assert 0 < stopped_at < 30
    resumed = subprocess.run(argv, env=python_env(), capture_output=True, text=True, timeout=600)  # the same command
    assert resumed.returncode == 0, resumed.stderr
    for cell in cells:
        assert json.loads((cell / "cell.json").read_text())["status"] == "done"
        starts = [r for r in _records(cell) if r["type"] == "start"]
        assert starts[0]["resumed_iteration"] == 0 and starts[-1]["resumed_iteration"] > 0


def test_jobs_with_cluster_jobs_is_refused(tmp_path: Path, capsys) -> None:
    base = write_base_config(tmp_path / "base.yaml")
    argv = ["study", "--config", str(base), *GRID, "--output", str(tmp_path / "s"), "--jobs", "2", "--submitit-local"]
    assert main(argv) == 2
    assert "--jobs runs cells on this machine" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
