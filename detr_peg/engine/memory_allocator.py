"""Keep freed CPU memory in the process: glibc's ``mallopt`` so that blocks of 32 MiB or more are reused, not unmapped.

Resident memory then stays at its peak. Off with ``DETR_PEG_MALLOC=system``; left alone on other C libraries, with
a preloaded allocator or glibc's ``MALLOC_*`` set (see docs/performance.md).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

#: ``mallopt`` parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

#: The largest trim threshold ``mallopt`` takes (an ``int``).
MAX_TRIM_THRESHOLD = 2**31 - 1

#: Setting this environment variable to ``system`` leaves the C library's allocator as it is.
OPT_OUT_VARIABLE = "DETR_PEG_MALLOC"

_PRELOADED_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The process's own C library when it is glibc (looked up once; no ``ldconfig`` run)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the symbols the process already has, the C library's among them
    except OSError:
        return None
    # gnu_get_libc_version exists in glibc only (musl has mallopt as a no-op stub).
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    return libc


def left_alone_because(environ: dict[str, str] | None = None) -> str | None:
    """Why :func:`retain_freed_memory` would do nothing here (None: it applies)."""
    env = os.environ if environ is None else environ
    if env.get(OPT_OUT_VARIABLE, "").lower() == "system":
        return f"{OPT_OUT_VARIABLE}=system"
    preload = env.get("LD_PRELOAD", "")
    if any(name in preload for name in _PRELOADED_ALLOCATORS):
        return f"LD_PRELOAD={preload}"
    for name in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        if name in env:
            return f"{name} is set"
    if _glibc() is None:
        return "the C library is not glibc"
    return None


def retain_freed_memory() -> bool:
    """Make glibc keep freed memory (``M_MMAP_MAX = 0``, largest trim threshold); returns whether settings changed."""
    libc = _glibc()
    if libc is None or left_alone_because() is not None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, MAX_TRIM_THRESHOLD))
