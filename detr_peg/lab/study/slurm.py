"""A study's cells as submitit jobs (SLURM, or local processes): one job per cell, one task per GPU.

Each task exports the ``torch.distributed`` environment, so the cell's ``detr-peg train``/``eval`` join one
process group as under torchrun; the main task writes ``cell.json``. Job logs go to ``STUDY/jobs/``.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from detr_peg.errors import ConfigError
from detr_peg.lab.study.cell import (
    CellOutcome,
    CellPaths,
    CommandRunner,
    cell_paths,
    eval_argv,
    is_done,
    read_state,
    run_cell,
    train_argv,
    write_state,
)
from detr_peg.lab.study.grid import Cell, EvalPlan
from detr_peg.lab.study.runner import describe
from detr_peg.messages import install_hint

JOBS_DIR = "jobs"


@dataclass(frozen=True)
class ClusterOptions:
    """Each cell job's resources: partition, nodes, GPUs per node, time (``HH:MM:SS``), CPUs per task, memory."""

    partition: str | None = None
    nodes: int = 1
    gpus_per_node: int = 8
    time: str = "72:00:00"
    cpus_per_task: int = 10
    mem: str | None = None
    local: bool = False

    @property
    def processes(self) -> int:
        return self.nodes * self.gpus_per_node


def parse_time(text: str) -> int:
    """Minutes of a SLURM time limit (``HH:MM:SS``, ``MM:SS``... as sbatch reads it: ``MM``, ``D-HH:MM:SS``)."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not match:
        raise ConfigError(f"--time {text!r} is not a time limit (for example 72:00:00, 90 or 2-00:00:00).")
    days, a, b, c = (int(g) if g else None for g in match.groups())
    if c is not None:  # H:M:S
        minutes = a * 60 + b + c / 60
    elif b is not None:  # days given: H:M, else M:S
        minutes = a * 60 + b if days is not None else a + b / 60
    else:  # M, or H with days
        minutes = a * 60 if days is not None else a
    minutes += (days or 0) * 24 * 60
    if minutes <= 0:
        raise ConfigError(f"--time {text!r} must be longer than zero.")
    return max(1, round(minutes))


def parse_mem(text: str) -> float:
    """Gigabytes of a memory amount (``64G``, ``500M``, ``1T``, or a number of gigabytes)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([MGT]?)B?", text.strip().upper())
    if not match:
        raise ConfigError(f"--mem {text!r} is not an amount of memory (for example 64G or 500M).")
    value, unit = float(match.group(1)), match.group(2) or "G"
    return value * {"M": 1 / 1024, "G": 1, "T": 1024}[unit]


def require_submitit():
    """The ``submitit`` module, or ``ConfigError`` with the command that installs it."""
    try:
        import submitit
    except ImportError:
        raise ConfigError(f"--slurm and --submitit-local need submitit: {install_hint('submitit')}.") from None
    return submitit


def make_executor(study_dir: Path, options: ClusterOptions):
    """The submitit executor of the study's jobs (logs in ``STUDY/jobs/``)."""
    submitit = require_submitit()

    folder = Path(study_dir) / JOBS_DIR / "%j"
    timeout = parse_time(options.time)
    if options.local:
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(
            timeout_min=timeout, tasks_per_node=options.gpus_per_node, gpus_per_node=options.gpus_per_node
        )
        return executor
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    params = {
        "timeout_min": timeout,
        "nodes": options.nodes,
        "tasks_per_node": options.gpus_per_node,
        "gpus_per_node": options.gpus_per_node,
        "cpus_per_task": options.cpus_per_task,
        "name": "detr-peg-study",
    }
    if options.partition:
        params["slurm_partition"] = options.partition
    if options.mem:
        params["mem_gb"] = parse_mem(options.mem)
    executor.update_parameters(**params)
    return executor


class CellJob:
    """The function a cell's job runs in each of its tasks (picklable: plain values only)."""

    def __init__(self, cell: Cell, paths: CellPaths, plan: EvalPlan, run_command: CommandRunner) -> None:
        self.cell, self.paths, self.plan, self.run_command = cell, paths, plan, run_command

    def __call__(self) -> CellOutcome:
        import submitit

        env = submitit.JobEnvironment()
        if env.num_tasks > 1:
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        return run_cell(self.cell, self.paths, self.plan, self.run_command, is_main=env.global_rank == 0)


def submit(
    study_dir: Path, cells: Sequence[Cell], plan: EvalPlan, options: ClusterOptions, run_command: CommandRunner
) -> list:
    """Submit one job per cell (as a job array on SLURM); returns the submitit jobs in cell order."""
    executor = make_executor(study_dir, options)
    with executor.batch():
        jobs = [executor.submit(CellJob(cell, cell_paths(study_dir, cell), plan, run_command)) for cell in cells]
    return jobs


def wait(
    study_dir: Path, jobs: Sequence, cells: Sequence[Cell], total: int, initial: int, poll_seconds: float = 10
) -> list[CellOutcome]:
    """Wait for the jobs with a progress bar; a job that crashed counts as failed."""
    import submitit

    outcomes = []
    with tqdm(
        total=total, initial=initial, unit="cell", desc="study", dynamic_ncols=True, disable=not sys.stderr.isatty()
    ) as bar:
        for job in submitit.helpers.as_completed(list(jobs), poll_frequency=poll_seconds):
            cell = cells[list(jobs).index(job)]
            try:
                outcome = job.results()[0]  # the main task's
            except Exception as exc:  # noqa: BLE001  (the job itself died time limit, node failure, ...)
                message = str(exc).strip().splitlines()
                outcome = CellOutcome(cell.name, "failed", f"job {job.job_id}: {message[-1] if message else exc}")
                _record_failure(study_dir, cell, outcome.error)
            outcomes.append(outcome)
            bar.update(1)
            bar.write(describe(outcome, initial + len(outcomes), total), file=sys.stdout)
    return outcomes


def _record_failure(study_dir: Path, cell: Cell, error: str) -> None:
    """Mark the cell of a job that died as failed with ``error`` (it resumes from its checkpoint next time)."""
    paths = cell_paths(study_dir, cell)
    state = read_state(paths)
    if state is not None and state.get("status") != "done":
        write_state(paths, {**state, "status": "failed", "error": error})


def plan_lines(study_dir: Path, cells: Sequence[Cell], plan: EvalPlan, options: ClusterOptions | None) -> list[str]:
    """The commands of every cell, as a user would type them (``--plan``); a cell already done says so."""
    if options is None or options.processes == 1:
        launcher = ["detr-peg"]
    else:
        launcher = [
            "torchrun",
            f"--nnodes={options.nodes}",
            f"--nproc_per_node={options.gpus_per_node}",
            "-m",
            "detr_peg.cli.main",
        ]
    lines = []
    if options is not None and not options.local:
        lines.append(
            f"# one SLURM job per cell: {options.nodes} node(s) x {options.gpus_per_node} GPU(s), "
            f"time {options.time}, {options.cpus_per_task} CPUs per GPU"
            + (f", partition {options.partition}" if options.partition else "")
            + (f", memory {options.mem}" if options.mem else "")
        )
    for cell in cells:
        paths = cell_paths(study_dir, cell)
        done = is_done(study_dir, cell)
        lines.append(f"# cell {cell.name}" + (" (done: the study skips it)" if done else ""))
        for argv in (train_argv(cell, paths), eval_argv(paths, plan)):
            if argv is not None:
                lines.append(shlex.join([*launcher, *argv]))
    return lines
