"""Device synchronisation, memory and FLOP measurements for one PyTorch model.

Times are wall-clock medians over repeated runs after warm-up
(:func:`~detr_peg.lab.benchmark.timing.time_runs`), with the device synchronised
around each run (:func:`synchronize`). FLOPs come from
``torch.utils.flop_counter.FlopCounterMode`` (matrix multiplications,
convolutions and attention; element-wise work such as ``grid_sample`` is not
counted, so deformable models are slightly under-counted). Peak memory is
``torch.cuda.max_memory_allocated`` on GPU and the process's peak resident set
size on CPU (each benchmark case runs in a fresh process, so this is the
case's own peak, including the Python interpreter and libraries).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from detr_peg.lab.benchmark.timing import peak_rss_bytes


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    return peak_rss_bytes()
