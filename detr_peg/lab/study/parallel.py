"""Cells side by side on one machine (``detr-peg study --jobs N``), each in its own process.

On Linux cells fork from a server that preloaded torch (:data:`PRELOAD`), elsewhere they spawn. Ctrl-C
reaches the study, which passes it once to every cell (each stops after its checkpoint).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from types import FrameType

from tqdm import tqdm

from detr_peg.lab.study.cell import CellOutcome, CellPaths, CommandRunner, cell_paths, is_done, run_cell
from detr_peg.lab.study.grid import Cell, EvalPlan

#: How often (seconds) the study looks at its cells when none has ended.
POLL_SECONDS = 1.0
#: Imported once by the fork server the cell processes are forked from.
PRELOAD = ["torch", "detr_peg.models", "detr_peg.lab.study.parallel"]


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity mask
        return os.cpu_count() or 1


def threads_per_job(jobs: int, cores: int | None = None) -> int:
    """Torch threads of each of ``jobs`` cells running together: an equal share of the cores, at least 1."""
    return max(1, (cores or available_cores()) // jobs)


def _cell_process(
    cell: Cell, paths: CellPaths, plan: EvalPlan, run_command: CommandRunner, threads: int, conn: Connection
) -> None:
    """The body of a cell's process: its own process group, its threads, the cell, the outcome sent back."""
    os.setpgrp()  # out of the terminal's group: Ctrl-C goes to the study, which passes it on once
    signal.signal(signal.SIGINT, signal.default_int_handler)  # both ignored in the fork server
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import torch

        import detr_peg.models  # noqa: F401  (registers the architectures that the cell's config names)

        torch.set_num_threads(threads)
        conn.send(run_cell(cell, paths, plan, run_command))
    except KeyboardInterrupt:  # a signal before the cell's command took it over: no traceback, a stop
        sys.exit(130)
    finally:
        conn.close()


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _cell_context() -> multiprocessing.context.BaseContext:
    """The fork server's context on Linux (started now, ignoring stop signals); else ``spawn``."""
    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    # An ignored signal stays ignored across fork and exec: the server ignores SIGINT and SIGTERM, and each cell
    # takes the default handlers back first (_cell_process). The study ignores them only while it starts the server.
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _STOP_SIGNALS}
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return context


@dataclass
class _Running:
    cell: Cell
    process: multiprocessing.process.BaseProcess
    conn: Connection
    started: float


class _Forwarder:
    """Passes SIGINT / SIGTERM on to the running cells; records that the study must stop."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.running: list[_Running] = []
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        for job in self.running:
            if job.process.pid is not None and job.process.is_alive():
                try:
                    os.kill(job.process.pid, signum)
                except ProcessLookupError:
                    pass

    def __enter__(self) -> _Forwarder:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def run_parallel(
    study_dir: str | Path,
    cells: Sequence[Cell],
    plan: EvalPlan,
    run_command: CommandRunner,
    *,
    jobs: int,
    describe,
) -> tuple[list[CellOutcome], int | None]:
    """Run the cells not done, ``jobs`` at a time; outcomes and stopping signal (``run_command``: module-level)."""
    study_dir = Path(study_dir)
    context = _cell_context()
    threads = threads_per_job(jobs)
    done = {c.name for c in cells if is_done(study_dir, c)}
    todo = [cell for cell in cells if cell.name not in done]
    outcomes = [CellOutcome(cell.name, "skipped") for cell in cells if cell.name in done]
    bar = tqdm(total=len(cells), initial=len(outcomes), unit="cell", desc="study", disable=not sys.stderr.isatty())
    with _Forwarder() as forward:
        try:
            while todo or forward.running:
                while todo and len(forward.running) < jobs and forward.signum is None:
                    cell = todo.pop(0)
                    receive, send = context.Pipe(duplex=False)
                    process = context.Process(
                        target=_cell_process,
                        args=(cell, cell_paths(study_dir, cell), plan, run_command, threads, send),
                        name=f"detr-peg cell {cell.name}",
                    )
                    process.start()
                    send.close()  # the child holds the sending end
                    forward.running.append(_Running(cell, process, receive, time.monotonic()))
                if forward.signum is not None and not forward.running:
                    break
                wait([job.process.sentinel for job in forward.running], timeout=POLL_SECONDS)
                for job in [j for j in forward.running if not j.process.is_alive()]:
                    forward.running.remove(job)
                    outcome = _outcome(job, study_dir, stopping=forward.signum is not None)
                    outcomes.append(outcome)
                    bar.update(1)
                    bar.write(describe(outcome, len(outcomes), len(cells)), file=sys.stdout)
        finally:
            for job in forward.running:  # an error in the study itself: the cells stop with it
                job.process.terminate()
                job.process.join()
            bar.close()
    return outcomes, forward.signum


def _outcome(job: _Running, study_dir: Path, *, stopping: bool) -> CellOutcome:
    """The outcome a finished cell process sent; else an interruption or a failure naming the exit status and log."""
    job.process.join()
    try:
        if job.conn.poll():
            return job.conn.recv()
    except (EOFError, OSError):
        pass
    finally:
        job.conn.close()
    log = cell_paths(study_dir, job.cell).log
    code = job.process.exitcode
    if stopping:
        return CellOutcome(job.cell.name, "interrupted", "stopped by a signal", 130, time.monotonic() - job.started)
    reason = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
    return CellOutcome(
        job.cell.name,
        "failed",
        f"the cell's process ended without a result ({reason}); see {log}",
        code if code and code > 0 else 1,
        time.monotonic() - job.started,
    )
