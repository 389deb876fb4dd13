"""A user error met by one process during evaluation reaches every process (2 processes, gloo, CPU).

Without that, the process that met non-finite outputs (or a bad image) would
stop while the others wait for it in the gather of the detections until the
collective's timeout. Here process 1's predictions fail; both processes must
raise, process 0 with a sentence saying another process stopped.
"""

from __future__ import annotations

import datetime
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from detr_peg.errors import UserError

MESSAGE = "The model produced 3 non-finite values (nan) in 'pred_boxes'; no metrics or detections are reported."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    import detr_peg.engine.evaluation.evaluate as evaluate_module

    def predict_coco(*args, **kwargs):
        if rank == 1:
            raise UserError(MESSAGE)
        return []

    evaluate_module.predict_coco = predict_coco
    try:
        evaluate_module.evaluate(None, [], coco_gt=None, device=torch.device("cpu"), label_map=None, is_main=rank == 0)
        outcome = "returned"
    except UserError as exc:
        outcome = str(exc)
    finally:
        dist.destroy_process_group()
    Path(folder, f"{rank}.txt").write_text(outcome)
    # Leave without the interpreter's shutdown: with both outcomes written, gloo's threads now and
    # then aborted the process while it was torn down ("terminate called without an active
    # exception"), after everything this test checks had happened.
    os._exit(0)


def test_an_error_in_one_process_is_raised_in_every_process(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    assert (tmp_path / "1.txt").read_text() == MESSAGE
    assert (tmp_path / "0.txt").read_text() == f"Another process stopped: {MESSAGE}"
