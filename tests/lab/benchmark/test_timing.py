"""The torch-free measurements of ``detr-peg bench`` (``detr_peg.lab.benchmark.timing``).

``peak_rss_bytes`` must report a process's own high-water mark: a small process
started by a large one (as every bench case is started by the bench) must not
report the large one's size, which ``getrusage``'s ``ru_maxrss`` would.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import textwrap

import pytest

from detr_peg.lab.benchmark.timing import peak_rss_bytes, time_runs
from tests.conftest import REPO_ROOT

MIB = 1 << 20


def test_time_runs_calls_warmup_then_runs_and_syncs_after_the_warmup_and_every_run() -> None:
    events: list[str] = []
    timing = time_runs(lambda: events.append("run"), warmup=2, runs=3, sync=lambda: events.append("sync"))
    assert events == ["run", "run", "sync", "run", "sync", "run", "sync", "run", "sync"]
    assert len(timing.runs) == 3 and all(t >= 0 for t in timing.runs)
    assert timing.median == statistics.median(timing.runs)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is read from Linux's /proc")
def test_a_small_child_of_a_large_process_reports_its_own_peak() -> None:
    # The parent touches 1 GiB, then starts a child that only imports the timing module.
    script = textwrap.dedent(
        f"""
        import subprocess, sys
        big = bytearray({1024 * MIB})
        for i in range(0, len(big), 4096):
            big[i] = 1
        from detr_peg.lab.benchmark.timing import peak_rss_bytes
        child = subprocess.run(
            [sys.executable, "-c", "from detr_peg.lab.benchmark.timing import peak_rss_bytes; print(peak_rss_bytes())"],
            capture_output=True, text=True, check=True,
        )
        print(peak_rss_bytes(), child.stdout.strip())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    parent, child = map(int, out.stdout.split())
    assert parent > 1024 * MIB
    assert child < 512 * MIB, f"the child reported {child / MIB:.0f} MiB, its parent's peak was {parent / MIB:.0f} MiB"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmRSS is read from Linux's /proc")
def test_this_process_peak_is_at_least_what_it_holds_now() -> None:
    with open("/proc/self/status") as file:
        current = next(int(line.split()[1]) * 1024 for line in file if line.startswith("VmRSS:"))
    assert peak_rss_bytes() >= current > 0
