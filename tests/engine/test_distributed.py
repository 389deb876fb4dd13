"""``torchrun --nproc_per_node 2`` on the CPU (gloo): training, evaluation, and equality with one process.

Two processes of batch 2 must compute the same first iteration as one
process of batch 4 on the same four images: the sampler deals the images of
global batch ``i`` to the processes, augmentation depends only on (seed,
epoch, image), and the loss is normalised by the number of target boxes
averaged over processes, so the average of the processes' losses is the
single-process loss and the DDP gradient average is its gradient.

That holds for the L1 and GIoU terms and for a cross-entropy whose classes
all weigh the same, not for everything, so the configuration avoids what does
not decompose over processes:

* ``loss.eos_coef=1.0``: DETR's class-weighted cross-entropy is a weighted
  mean over each process's queries; with a "no object" weight below 1 the
  denominators differ per process and the mean of means is not the global mean;
* ``model.backbone.norm=frozen_bn`` and the sine encoding: BatchNorm in training
  mode (``bn``, and PEG's BatchNorm) normalises with each process's own batch
  statistics;
* ``model.transformer.dropout=0`` (each process draws its own dropout masks)
  and ``data.crop_prob=0`` with square images of one size, so no batch is
  padded differently.

Measured: the first-iteration total loss is the same float32 number (7.846823)
in both runs, its terms differ by at most 1.2e-7, and the weights after two
optimizer steps by at most 1.5e-8.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from detr_peg.checkpoint.format import read_checkpoint
from detr_peg.engine.evaluation.coco_metrics import STAT_NAMES
from detr_peg.engine.training import run_training
from tests.conftest import REPO_ROOT, python_env
from tests.engine.tiny_run import synthetic_data, synthetic_overrides, tiny_config

DECOMPOSABLE = [
    "model.backbone.out_stages=[2]",
    "model.backbone.norm=frozen_bn",
    "model.position.name=sine",
    "model.transformer.dropout=0.0",
    "loss.eos_coef=1.0",
    "data.crop_prob=0",
    "train.max_iters=2",
    "train.eval_every=0",
]


def _records(path: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == kind]


@pytest.mark.slow
def test_two_processes_train_evaluate_and_match_one_process(tmp_path: Path) -> None:
    data = synthetic_data(tmp_path / "shapes", num_train=8, num_val=5)  # 5: the shards need padding
    single = run_training(
        tiny_config(synthetic_overrides(data, tmp_path / "single", *DECOMPOSABLE, "train.batch_size=4")),
        progress_bars=False,
    )

    out = tmp_path / "ddp"
    env = python_env(OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "detr_peg.cli.main",
        "train",
        *synthetic_overrides(data, out, *DECOMPOSABLE, "train.batch_size=2"),
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    start = _records(out / "metrics.jsonl", "start")[0]
    assert start["world_size"] == 2 and start["total_batch_size"] == 4 and start["iterations_per_epoch"] == 2
    first_ddp = _records(out / "metrics.jsonl", "iter")[0]
    first_single = _records(single.metrics_log, "iter")[0]
    assert first_ddp["iteration"] == first_single["iteration"] == 1
    for key in ("loss", "loss_ce", "loss_bbox", "loss_giou"):
        assert first_ddp[key] == pytest.approx(first_single[key], rel=1e-6, abs=1e-6), key

    ddp_weights = read_checkpoint(out / "checkpoint.pth").model
    single_weights = read_checkpoint(single.checkpoint).model
    for key, value in single_weights.items():
        torch.testing.assert_close(ddp_weights[key], value, rtol=1e-5, atol=1e-6, msg=key)

    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics["bbox"]) == list(STAT_NAMES) and metrics["num_images"] == 5
    detections = json.loads((out / "detections.json").read_text())
    single_detections = json.loads(single.detections_file.read_text())
    # Every image once, none twice although the sampler repeated one to even out the shards.
    assert sorted({d["image_id"] for d in detections}) == sorted({d["image_id"] for d in single_detections})
    assert len(detections) == len(single_detections)
    for name in STAT_NAMES:
        assert metrics["bbox"][name] == pytest.approx(single.metrics[name], abs=0.1), name  # percent: 0.1 point


@pytest.mark.slow
def test_a_bad_image_in_one_process_ends_every_process_in_one_line(tmp_path: Path) -> None:
    """The process that reads a truncated image names it; the other, whose collective lost its peer, says so; no
    process ends in a traceback of its own (torchrun's summary of the failed run is torchrun's)."""
    data = synthetic_data(tmp_path / "shapes", num_train=8, num_val=2)
    image = sorted(Path(data.train_images).glob("*.png"))[3]
    image.write_bytes(image.read_bytes()[:200])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "detr_peg.cli.main", "train", *synthetic_overrides(data, tmp_path / "run", *DECOMPOSABLE,
           "train.batch_size=2", "train.max_iters=4", "train.seed=1", "data.on_bad_sample=error")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=python_env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("detr-peg train: error:")]
    assert len(errors) == 2, proc.stderr[-3000:]
    assert any(f"Image file {image} cannot be decoded" in line for line in errors), errors
    assert any("another process of this run stopped first, and its own message says why" in line for line in errors)
    assert "RuntimeError" not in proc.stderr and "closed by peer" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("stop", ["time limit", "SIGTERM"])
def test_a_process_alone_in_its_group_stops_at_start_up(tmp_path: Path, stop: str) -> None:
    """WORLD_SIZE=2 and no second process: the start-up ends after DETR_PEG_START_TIMEOUT with one line, and a
    SIGTERM while it waits stops it at once (exit 143); nothing is written."""
    import signal
    import socket
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    limit = "3" if stop == "time limit" else "300"
    env = {**python_env(), "WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    args = [sys.executable, "-m", "detr_peg.cli.main", "train", "--config", "demo", "--output", "run"]
    proc = subprocess.Popen(
        args, cwd=tmp_path, env={**env, "DETR_PEG_START_TIMEOUT": limit}, stderr=subprocess.PIPE, text=True
    )
    if stop == "SIGTERM":
        deadline = time.monotonic() + 120
        while True:  # until the store listens: the process waits for the other one
            with socket.socket() as client:
                if client.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
    stderr = proc.communicate(timeout=120)[1]
    lines = stderr.strip().splitlines()
    if stop == "SIGTERM":
        assert proc.returncode == 143 and lines[-1].startswith("detr-peg train: stopped by SIGTERM"), stderr
    else:
        assert proc.returncode == 2 and len(lines) == 1, stderr
        assert lines[0].startswith("detr-peg train: error: the process group did not start: 1 of WORLD_SIZE=2")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"WORLD_SIZE": "-1"}, "WORLD_SIZE='-1' is not an integer from 1 to 1,048,576"),
        ({"WORLD_SIZE": "1", "RANK": "3"}, "RANK='3' is not an integer from 0 to 0"),
        ({"WORLD_SIZE": "9" * 23}, "WORLD_SIZE='99999999999999999999999' is not an integer"),
        ({"WORLD_SIZE": "2", "DETR_PEG_START_TIMEOUT": "abc"}, "DETR_PEG_START_TIMEOUT='abc' is not a number from 0"),
        ({"WORLD_SIZE": "2", "DETR_PEG_START_TIMEOUT": "nan"}, "DETR_PEG_START_TIMEOUT='nan' is not a number"),
        ({"WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not an integer from 1 to 65,535"),
        ({"LOCAL_RANK": "x"}, "LOCAL_RANK='x' is not an integer"),
    ],
)
def test_a_bad_process_group_variable_is_one_sentence(tmp_path: Path, env: dict, words: str) -> None:
    from tests.conftest import CLI, run_python

    proc = run_python(*CLI, "train", "--config", "demo", "--output", str(tmp_path / "run"), cwd=tmp_path, **env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith(f"detr-peg train: error: Environment variable {words}") and lines[0].endswith(".")
    assert not (tmp_path / "run" / "checkpoint.pth").exists()
