"""Timing, memory and FLOP measurements for one model on one device.

Times are wall-clock medians over repeated runs after warm-up, with the
device synchronised around each run. FLOPs come from
``torch.utils.flop_counter.FlopCounterMode`` (matrix multiplications,
convolutions and attention; element-wise work such as ``grid_sample`` is not
counted, so deformable models are slightly under-counted). Peak memory is
``torch.cuda.max_memory_allocated`` on GPU and the process's peak resident set
size on CPU (each benchmark case runs in a fresh process, so this is the
case's own peak, including the Python interpreter and libraries).
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode


@dataclass
class Timing:
    """Seconds per run: the median and every run."""

    median: float
    runs: list[float] = field(default_factory=list)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runs(fn: Callable[[], object], device: torch.device, *, warmup: int, runs: int) -> Timing:
    """Call ``fn`` ``warmup`` times, then time ``runs`` calls; return the median."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return Timing(statistics.median(times), times)


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of one call of ``fn`` (multiply-add = 2 FLOPs)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    """GPU: peak allocated by torch since the last reset; CPU: this process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)
