"""Faults while training: SIGKILL at random moments, SIGINT, a full disk, an unwritable output folder.

* A run killed with SIGKILL at several random moments (after a random
  iteration, plus a random fraction of the next one; the checkpoint is written
  after every iteration, so kills land in forward passes, backward passes and
  checkpoint writes), then stopped with SIGINT and resumed to the end, ends
  with exactly the weights of an uninterrupted run (CPU, deterministic
  settings, dropout, random flips and crops on). After every kill the
  checkpoint under its final name is complete. The random moments come from
  a seed printed on failure (``DETR_PEG_KILL_SEED`` repeats one).
  ``tests/engine/test_interruptions.py`` does one kill and a SIGTERM.
* A process killed in the middle of writing large checkpoints never leaves a
  partial file under the final name.
* A disk that fills up (``RLIMIT_FSIZE``: writes past the limit fail with
  ``EFBIG``) during a checkpoint write ends the run with one line, status 2,
  the previous checkpoint byte-identical and no temporary file; a disk that
  is too small is reported before training starts.
* An output folder that cannot be created or written is reported before
  training starts.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import time
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from detr_peg.checkpoint.files import atomic_torch_save
from detr_peg.checkpoint.format import read_checkpoint, save_checkpoint
from detr_peg.cli.main import main
from detr_peg.config import load_config
from detr_peg.engine import checkpointing
from detr_peg.errors import CheckpointError
from tests.cli_process import apply_limits, can_drop_file_access_override
from tests.engine.tiny_run import logged_iterations, wait_for_iteration
from tests.reliability.conftest import (
    BASE,
    IMAGES,
    OUT,
    RESUME,
    assert_one_line_error,
    assert_outputs_kept,
    assert_success,
    running_as_root,
    snapshot,
)

ITERATIONS = 12
#: Six epochs of two iterations, the learning rate dropping every second epoch; no validation.
KILL_RUN = [
    *BASE,
    "train.epochs=6",
    "train.lr_drop=2",
    "train.lr=1e-3",
    "data.crop_prob=0.5",
    "data.hflip_prob=0.5",
    "data.val_images=null",
    "data.val_annotations=null",
    "train.deterministic=true",
]


def _watch(proc) -> dict:
    """``ended``/``kill`` of :func:`wait_for_iteration` for a :class:`CliProcess`, polled every 5 ms."""
    return dict(
        ended=lambda: proc.poll() and proc.wait(), kill=lambda: proc.send_signal(signal.SIGKILL), interval=0.005
    )


def _weights_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


def test_killed_at_random_moments_then_interrupted_resumes_to_the_uninterrupted_weights(cli, case: Path) -> None:
    seed = int(os.environ.get("DETR_PEG_KILL_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    reference = cli.run(["train", *KILL_RUN, "train.output_dir=reference"], cwd=case)
    assert_success(reference)
    expected = read_checkpoint(case / "reference" / "checkpoint.pth")
    assert expected.extra["iteration"] == ITERATIONS

    args = ["train", "--resume", *KILL_RUN, "train.output_dir=run", "train.checkpoint_every=1"]
    metrics = case / "run" / "metrics.jsonl"
    moments = []
    kept = 0
    for _ in range(3):
        before = len(logged_iterations(metrics))
        proc = cli.start(args, cwd=case)
        # The resumed process starts from the checkpoint (a killed one may have logged an iteration past it), and
        # kills stay clear of the last iterations, so that the SIGINT below lands before the end.
        target = min(kept + rng.randint(0, 1), ITERATIONS - 7)
        reached = wait_for_iteration(metrics, above=target, since=before, **_watch(proc))
        delay = rng.uniform(0.0, 0.15)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        result = proc.wait()
        assert result.returncode == -signal.SIGKILL, f"seed {seed}, moments {moments}: {result.stderr}"
        if (case / "run" / "checkpoint.pth").exists():  # a kill before the first write leaves none
            kept = read_checkpoint(case / "run" / "checkpoint.pth").extra["iteration"]  # complete, whatever the moment
            assert 1 <= kept < ITERATIONS, f"seed {seed}, moments {moments}"
        moments.append({"after_iteration": reached, "delay_s": round(delay, 3), "checkpoint_iteration": kept})

    # SIGINT once the resumed process logs its first iteration: it stops after the iteration under way.
    before = len(logged_iterations(metrics))
    proc = cli.start(args, cwd=case)
    last = wait_for_iteration(metrics, above=0, since=before, **_watch(proc))
    proc.send_signal(signal.SIGINT)
    stopped = proc.wait()
    line = assert_one_line_error(stopped, "Stopped by SIGINT at iteration", "continue with --resume", returncode=130)
    at = int(line.split("at iteration ")[1].split(";")[0])
    assert last <= at < ITERATIONS, f"seed {seed}, moments {moments}"
    assert read_checkpoint(case / "run" / "checkpoint.pth").extra["iteration"] == at

    assert_success(cli.run(args, cwd=case))
    final = read_checkpoint(case / "run" / "checkpoint.pth")
    assert final.extra["iteration"] == ITERATIONS
    different = _weights_equal(final.model, expected.model)
    assert not different, f"seed {seed}, moments {moments}: {len(different)} tensors differ, first {different[:3]}"
    assert not [p.name for p in (case / "run").iterdir() if ".tmp" in p.name]


def test_a_checkpoint_killed_mid_write_is_never_half_written(tmp_path: Path) -> None:
    """Kill a process that rewrites a 32 MB checkpoint in a loop, eight times at random moments."""
    path = tmp_path / "checkpoint.pth"
    versions = [{"version": v, "w": torch.full((8_000_000,), float(v))} for v in range(2)]
    atomic_torch_save(versions[0], path)
    rng = random.Random(0)
    interrupted_writes = 0
    for _ in range(8):
        pid = os.fork()
        if pid == 0:
            try:
                for i in range(10_000):
                    atomic_torch_save(versions[i % 2], path)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.02, 0.3))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        leftovers = list(tmp_path.glob(".checkpoint.pth.tmp-*"))
        interrupted_writes += bool(leftovers)
        for leftover in leftovers:
            leftover.unlink()
        loaded = torch.load(path, weights_only=True)
        assert torch.equal(loaded["w"], versions[loaded["version"]]["w"])
    # Most kills land in a write (it takes most of the loop's time); the file above was complete each time.
    assert interrupted_writes >= 1


def test_a_full_disk_while_writing_a_checkpoint_keeps_the_previous_one(cli, case: Path) -> None:
    size = (case / OUT / "checkpoint.pth").stat().st_size
    before = snapshot(case / OUT)
    result = cli.run(RESUME, cwd=case, limits=[("fsize", size // 2)])
    assert_one_line_error(
        result,
        "Could not write out/checkpoint.pth: File too large",
        "Training stopped at iteration 4",
        "the previous checkpoint (if any) is intact",
    )
    assert_outputs_kept(before, case / OUT)  # byte-identical, no temporary file left
    assert read_checkpoint(case / OUT / "checkpoint.pth").extra["iteration"] == 2


def test_a_disk_without_room_for_one_file_fails_before_training(cli, case: Path) -> None:
    before = snapshot(case / OUT)
    result = cli.run(RESUME, cwd=case, limits=[("fsize", 1000)])
    assert_one_line_error(
        result, "Output folder out has no room to write (File too large)", "choose another train.output_dir"
    )
    assert_outputs_kept(before, case / OUT)
    assert "iter" not in (case / OUT / "metrics.jsonl").read_text()[len(before["metrics.jsonl"]) :]


def test_loader_workers_with_too_few_open_files_fail_before_training(cli, case: Path) -> None:
    """Workers pass tensors as file descriptors: with too few, one failed to send and the loader waited forever."""
    before = snapshot(case / OUT)
    result = cli.run([*RESUME, "data.num_workers=2"], cwd=case, limits=[("open_files", 64, 64)], timeout=300)
    assert_one_line_error(
        result,
        "data.num_workers=2 needs at least 1024 open files (loader workers pass tensors as file descriptors), "
        "but this process may have 64 (ulimit -n); raise it or set data.num_workers=0.",
    )
    assert_outputs_kept(before, case / OUT)
    # A soft limit below a higher hard limit is raised to it, as `ulimit -n` would be by hand.
    assert_success(cli.run([*RESUME, "data.num_workers=2"], cwd=case, limits=[("open_files", 64, 4096)]))


def test_too_little_free_space_fails_before_training(case: Path, monkeypatch, capsys) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpointing.shutil, "disk_usage", lambda p: usage(10 << 30, 10 << 30, 5 << 20))
    monkeypatch.chdir(case)
    before = snapshot(case / OUT)
    assert main(RESUME) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("detr-peg train: error: Output folder out has 5 MiB free but a checkpoint needs about ")
    assert len(err.splitlines()) == 1
    assert_outputs_kept(before, case / OUT)


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_a_failed_model_file_write_keeps_the_previous_file(tmp_path: Path, suffix: str) -> None:
    """``save_checkpoint`` (used by ``convert``) on a disk that fills up, in a child process."""
    cfg = load_config(None, [])
    path = tmp_path / f"model{suffix}"
    save_checkpoint(path, cfg, {"w": torch.zeros(4)})
    before = path.read_bytes()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        message = b"no error"
        try:
            apply_limits([("fsize", 100_000)])
            save_checkpoint(path, cfg, {"w": torch.zeros(1_000_000)})
        except CheckpointError as exc:
            message = str(exc).encode()
        except BaseException as exc:  # reported to the parent as a failure
            message = f"{type(exc).__name__}: {exc}".encode()
        finally:
            os.write(write_end, message)
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode()
    assert message == f"Could not write {path}: File too large."
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_an_output_folder_under_a_file_fails_before_training(cli, case: Path) -> None:
    (case / "taken").write_text("a file, not a folder\n")
    before = snapshot(case / OUT)
    result = cli.run(["train", *BASE, "train.output_dir=taken/run", "train.epochs=1"], cwd=case)
    assert_one_line_error(
        result, "Could not write into train.output_dir taken/run: taken is a file, not a folder; choose another path."
    )
    assert_outputs_kept(before, case / OUT)


@pytest.mark.parametrize("command", ["train", "eval", "predict"])
def test_a_read_only_output_folder_is_reported(cli, case: Path, command: str) -> None:
    limits = []
    if running_as_root():
        reason = can_drop_file_access_override()
        if reason is not None:
            pytest.skip(f"running as root, where every folder is writable, and {reason}")
        limits.append(("no_dac_override",))
    (case / "locked").mkdir()
    (case / "locked").chmod(0o555)
    args = {
        "train": ["train", *BASE, "train.output_dir=locked", "train.epochs=1"],
        "eval": ["eval", "--checkpoint", OUT / "checkpoint.pth", "--output", "locked"],
        "predict": ["predict", "--checkpoint", OUT / "checkpoint.pth", IMAGES, "--output", "locked"],
    }[command]
    result = cli.run(args, cwd=case, limits=limits)
    assert_one_line_error(result, "locked", "Permission denied; choose a folder you can write to")
    assert list((case / "locked").iterdir()) == []


def test_errno_of_a_full_disk_is_named(tmp_path: Path, monkeypatch) -> None:
    """ENOSPC before training: the message says the disk is full, not that permissions are wrong."""

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpointing.os, "fsync", full)
    with pytest.raises(Exception, match="has no room to write .No space left on device.; free some space"):
        checkpointing.check_output_dir(tmp_path / "run", 1000)
