"""Processes and devices: the ``torchrun`` process group (NCCL on CUDA, gloo on the CPU), reductions and gathers.

Every helper also works in a single process, where it returns its input unchanged.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from detr_peg.errors import ConfigError, TrainingError, UserError


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands (``local_rank`` selects the GPU)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """True in the process that logs, writes files and evaluates."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1


T = TypeVar("T")


def _env_number(name: str, default: int, low: int, high: int, kind: type = int) -> Any:
    """The environment variable ``name`` as a ``kind`` in ``[low, high]`` (``default`` when unset), or ConfigError."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        number = kind(value) if len(value) < 30 else None
    except ValueError:
        number = None
    if number is None or not low <= number <= high:  # NaN too
        raise ConfigError(
            f"Environment variable {name}={value[:40]!r} is not {'an integer' if kind is int else 'a number'} from {low} to {high:,}."
        )
    return number


def resolve_device(spec: str, local_rank: int = 0, name: str = "train.device") -> torch.device:
    """The device ``spec`` names (``auto``, ``cpu``, ``cuda``: GPU ``local_rank``, ``cuda:N``), or a ConfigError
    naming the setting ``name``."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return torch.device("cpu")
    if not re.fullmatch(r"cuda(:[0-9]+)?", spec):
        raise ConfigError(f"{name} is {spec!r}; valid are 'auto', 'cpu', 'cuda' and 'cuda:N'.")
    if not torch.cuda.is_available():
        raise ConfigError(f"{name} is {spec!r} but CUDA is not available; use {name}=cpu.")
    index = local_rank if spec == "cuda" else int(spec.split(":", 1)[1])
    if index >= torch.cuda.device_count():
        raise ConfigError(f"{name} asks for GPU {index} but only {torch.cuda.device_count()} are visible.")
    return torch.device("cuda", index)


def init_distributed(device_spec: str = "auto") -> DistEnv:
    """Join the ``torchrun`` process group (reused if it exists), or describe the single process."""
    world_size = _env_number("WORLD_SIZE", 1, 1, 2**20)
    rank = _env_number("RANK", 0, 0, world_size - 1)
    local_rank = _env_number("LOCAL_RANK", 0, 0, 2**20)
    device = resolve_device(device_spec, local_rank)
    if world_size > 1 and not (dist.is_available() and dist.is_initialized()):
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        store = _meet(rank, world_size)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(minutes=30))
    if dist.is_available() and dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def _meet(rank: int, world_size: int) -> dist.TCPStore:
    """The store at ``MASTER_ADDR:MASTER_PORT`` once all ``world_size`` processes reached it, waited for in short
    steps so that SIGTERM and Ctrl-C act; TrainingError after ``DETR_PEG_START_TIMEOUT`` seconds (default 600).
    Under ``torchrun`` the agent holds the store and every process is its client."""
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), _env_number("MASTER_PORT", 29500, 1, 65535)
    limit = _env_number("DETR_PEG_START_TIMEOUT", 600, 0, 86400, float)
    master = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    key = f"detr_peg/started/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    deadline, store, count = time.monotonic() + limit, None, 0
    while True:
        try:
            if store is None:
                store = dist.TCPStore(host, port, world_size, master, timedelta(seconds=1), wait_for_workers=False)
                store.add(key, 1)
            count = store.add(key, 0)
            if count >= world_size:
                store.set_timeout(timedelta(minutes=30))  # the group's own waits, as before
                return store
        except (RuntimeError, ValueError):  # the master is not listening yet
            pass
        if time.monotonic() > deadline:
            raise TrainingError(
                f"the process group did not start: {count} of WORLD_SIZE={world_size} processes reached "
                f"{host}:{port} within {limit:g} s; start the others with the same MASTER_ADDR and MASTER_PORT "
                "(torchrun does), or run one process (unset WORLD_SIZE)."
            )
        time.sleep(0.2)


@contextlib.contextmanager
def process_group(device_spec: str = "auto") -> Iterator[DistEnv]:
    """A command's process group; left on exit only if joined here (a caller's or an outer one is reused)."""
    owns_group = not (dist.is_available() and dist.is_initialized())
    env = init_distributed(device_spec)
    try:
        yield env
    finally:
        if owns_group:
            shutdown_distributed()


def shutdown_distributed() -> None:
    """Leave the process group if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_distributed() -> bool:
    """True inside an initialised process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    """Wait for every process (no-op in a single process)."""
    if is_distributed():
        dist.barrier()


def reduce_mean(values: dict[str, Tensor]) -> dict[str, Tensor]:
    """Average 0-dim tensors over processes (detached); non-finite values stay non-finite in every process."""
    detached = {k: v.detach() for k, v in values.items()}
    if not is_distributed() or not detached:
        return detached
    keys = sorted(detached)
    stacked = torch.stack([detached[k].float() for k in keys])
    dist.all_reduce(stacked)
    stacked /= dist.get_world_size()
    return dict(zip(keys, stacked.unbind()))


def any_process(flag: bool, device: torch.device) -> bool:
    """True if ``flag`` is true in any process (so all of them agree)."""
    if not is_distributed():
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def all_gather_objects(obj: Any) -> list[Any]:
    """Every process's ``obj`` (picklable), in rank order; ``[obj]`` in a single process."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """The ``obj`` of process ``src``, in every process."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def on_main(env: DistEnv, step: Callable[[], T]) -> T | None:
    """``step()``'s value in the main process, None elsewhere; a user error it raises is raised in every process.

    Otherwise the other processes would wait forever in their next collective operation.
    """
    result: T | None = None
    message: str | None = None
    error: UserError | None = None
    if env.is_main:
        try:
            result = step()
        except UserError as exc:
            error, message = exc, str(exc)
    if env.distributed:
        message = broadcast_object(message)
    if error is not None:
        raise error
    if message is not None:
        raise TrainingError(f"The main process stopped: {message}")
    return result
