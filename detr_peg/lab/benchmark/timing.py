"""Wall-clock timing, peak memory and CPU name: the measurements that need no torch."""

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
    """Call ``fn`` ``warmup`` times, then time ``runs`` calls; ``sync`` runs after the warm-up and each timed call."""
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
    """This process's peak RSS: ``VmHWM`` (``ru_maxrss`` would inherit the parent's high-water mark across ``exec``)."""
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
