"""A real training process killed with SIGKILL, then stopped with SIGTERM, then resumed to the end.

The command-line run writes its checkpoint after every iteration
(``train.checkpoint_every=1``), so SIGKILL can land while a checkpoint is being
written; the file under the final name must still be complete. SIGTERM must
end the process after one more iteration with a written checkpoint, exit
status 143 and one line on stderr. The final weights must equal those of an
uninterrupted run of the same 12 iterations (3 epochs) in this process.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import torch

from detr_peg.checkpoint.format import read_checkpoint
from detr_peg.engine.training import run_training
from tests.cli_process import CliProcess
from tests.conftest import REPO_ROOT, cli_runner
from tests.engine.test_training_runs import assert_same_weights, resume_overrides
from tests.engine.tiny_run import logged_iterations, tiny_config, wait_for_iteration

ITERATIONS = 12


def _start(args: list[str]) -> CliProcess:
    # Forked from the warm command runner, single-threaded as this process's training is (autouse fixture):
    # float sums depend on how work is split.
    assert torch.get_num_threads() == 1
    return cli_runner().start(["train", *args], cwd=REPO_ROOT)


def _watch(proc: CliProcess) -> dict:
    """``ended``/``kill`` of :func:`wait_for_iteration` for a started command."""
    return dict(ended=lambda: proc.poll() and proc.wait(), kill=lambda: proc.send_signal(signal.SIGKILL), interval=0.02)


def test_killed_then_stopped_run_resumes_to_the_uninterrupted_weights(shapes, tmp_path: Path) -> None:
    reference = run_training(
        tiny_config(resume_overrides(shapes, tmp_path / "reference", f"train.max_iters={ITERATIONS}")),
        progress_bars=False,
    )
    assert reference.iterations == ITERATIONS and reference.epochs_completed == 3

    out = tmp_path / "run"
    metrics = out / "metrics.jsonl"
    args = [*resume_overrides(shapes, out, f"train.max_iters={ITERATIONS}", "train.checkpoint_every=1"), "--resume"]

    killed = _start(args)
    wait_for_iteration(metrics, above=2, **_watch(killed))
    killed.send_signal(signal.SIGKILL)
    assert killed.wait().returncode == -signal.SIGKILL
    kept = read_checkpoint(out / "checkpoint.pth")  # complete, whatever the moment of the kill
    assert 1 <= kept.extra["iteration"] < ITERATIONS

    before = len(logged_iterations(metrics))
    stopped = _start(args)
    # The first iteration this process logs (the killed one may have logged one past its checkpoint).
    last = wait_for_iteration(metrics, above=0, since=before, **_watch(stopped))
    stopped.send_signal(signal.SIGTERM)
    result = stopped.wait()
    stderr = result.stderr
    assert result.returncode == 143, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("detr-peg train: error: Stopped by SIGTERM at iteration "), stderr
    at = int(lines[0].split("at iteration ")[1].split(";")[0])
    assert last <= at < ITERATIONS
    assert read_checkpoint(out / "checkpoint.pth").extra["iteration"] == at

    result = _start(args).wait()
    assert result.returncode == 0, result.stderr
    final = read_checkpoint(out / "checkpoint.pth")
    assert final.extra["iteration"] == ITERATIONS
    assert_same_weights(final.model, read_checkpoint(reference.checkpoint).model)
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]


def test_a_second_sigterm_stops_at_once_as_sigterm(shapes, tmp_path: Path) -> None:
    """Two SIGTERMs (a job scheduler's, a hurried user's): exit 143 and one line naming SIGTERM, not Ctrl-C's 130;
    the checkpoint on disk is a complete one."""
    out = tmp_path / "run"
    args = [*resume_overrides(shapes, out, "train.max_iters=400", "train.checkpoint_every=1"), "--resume"]
    proc = _start(args)
    wait_for_iteration(out / "metrics.jsonl", above=1, **_watch(proc))
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    result = proc.wait()
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 143 and len(lines) == 1 and "SIGTERM" in lines[0], result.stderr
    assert 1 <= read_checkpoint(out / "checkpoint.pth").extra["iteration"] < 400
