"""glibc keeps freed memory for reuse in detr-peg processes, and is left alone when the user chose otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from detr_peg.engine.memory_allocator import OPT_OUT_VARIABLE, _glibc, left_alone_because

needs_glibc = pytest.mark.skipif(_glibc() is None, reason="the C library is not glibc")

# Allocates a 64 MiB tensor and reports how many bytes glibc holds in mmap'ed blocks while it lives
# (mallinfo2().hblkhd), with or without retain_freed_memory() first.
PROBE = """
import ctypes, json, sys
import torch
from detr_peg.engine.memory_allocator import retain_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
if not hasattr(libc, "mallinfo2"):
    print(json.dumps(None)); sys.exit(0)
libc.mallinfo2.restype = MallInfo2
changed = retain_freed_memory() if sys.argv[1] == "retain" else False
before = libc.mallinfo2().hblkhd
t = torch.ones(16 * 1024 * 1024)  # 64 MiB
during = libc.mallinfo2().hblkhd
print(json.dumps({"changed": changed, "mmapped": during - before, "sum": float(t.sum())}))
"""


def _probe(mode: str, **env: str) -> dict | None:
    environ = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")}
    environ.update(env)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, env=environ, timeout=120
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_glibc
def test_large_tensors_come_from_the_heap_after_it() -> None:
    plain = _probe("plain")
    if plain is None:
        pytest.skip("this glibc has no mallinfo2")
    retained = _probe("retain")
    assert plain["mmapped"] >= 64 * 1024 * 1024  # glibc's default: its own mapping, unmapped when freed
    assert retained == {"changed": True, "mmapped": 0, "sum": 16 * 1024 * 1024}


@needs_glibc
def test_the_users_choice_is_kept() -> None:
    result = _probe("retain", **{OPT_OUT_VARIABLE: "system"})
    if result is None:
        pytest.skip("this glibc has no mallinfo2")
    assert result["changed"] is False and result["mmapped"] >= 64 * 1024 * 1024


@pytest.mark.parametrize(
    ("environ", "reason"),
    [
        ({OPT_OUT_VARIABLE: "system"}, f"{OPT_OUT_VARIABLE}=system"),
        ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "LD_PRELOAD="),
        ({"LD_PRELOAD": "libtcmalloc_minimal.so.4"}, "LD_PRELOAD="),
        ({"MALLOC_MMAP_MAX_": "65536"}, "MALLOC_MMAP_MAX_ is set"),
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}, "GLIBC_TUNABLES is set"),
    ],
)
def test_reasons_to_leave_the_allocator_alone(environ: dict[str, str], reason: str) -> None:
    assert (left_alone_because(environ) or "").startswith(reason)


@needs_glibc
def test_applies_on_glibc_by_default() -> None:
    assert left_alone_because({}) is None
