"""Wall-clock timing, the process's peak memory and the CPU's name: the measurements that need no torch.

:mod:`~detr_peg.lab.benchmark.measure` adds what needs torch (device
synchronisation, GPU memory, FLOPs); the ONNX Runtime case
(:mod:`~detr_peg.lab.benchmark.onnx_case`) times its runs with these functions
alone, in a process that never imports torch.
"""

from __future__ import annotations

import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Timing:
    """Seconds per run: the median and every run."""

    median: float
    runs: list[float] = field(default_factory=list)


def time_runs(fn: Callable[[], object], *, warmup: int, runs: int, sync: Callable[[], None] | None = None) -> Timing:
    """Call ``fn`` ``warmup`` times, then time ``runs`` calls; return the median.

    Args:
        fn: one run.
        warmup: untimed calls first.
        runs: timed calls.
        sync: waits for the device's queued work (CUDA); called after the
            warm-up and at the end of every timed call.
    """
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return Timing(statistics.median(times), times)


def peak_rss_bytes() -> int:
    """This process's peak resident set size (the interpreter and its libraries included).

    On Linux this is ``VmHWM`` of ``/proc/self/status``, the high-water mark
    of the process's own memory. ``getrusage``'s ``ru_maxrss`` (the fallback
    where there is no ``/proc``) also counts the parent's resident memory at the moment it started this
    process (``exec`` carries the old high-water mark over), so a small
    process started by a large one would report the large one's size.
    """
    try:
        with open("/proc/self/status") as file:
            for line in file:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"
