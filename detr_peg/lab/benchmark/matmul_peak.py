"""The machine's matrix-multiply peak, measured in the bench run itself.

Every benchmark row reports its achieved FLOP/s as a fraction of this peak, so
a figure says how far it is from the limit of the same machine, with the
same thread count, at the same moment (a shared machine's slow spell lowers
both). The peak is the best of a few timed ``torch.mm`` of two ``N x N``
matrices (``2 N^3`` FLOPs each) in the dtype the cases compute in: float32,
or bfloat16 / float16 for cases under autocast (``bench --amp``), whose
matrix products and convolutions run in that dtype; ``N = 4096`` is large
enough for the BLAS library to reach its steady rate on a CPU or a GPU.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch


@dataclass
class MatmulPeak:
    """A measured matrix-multiply peak.

    Attributes:
        flops_per_s: the best rate of the timed multiplies.
        size: ``N`` of the ``N x N`` operands.
        threads: CPU threads (``torch.set_num_threads``) during the measurement.
        device: ``cpu`` or ``cuda[:N]``.
        repeats: timed multiplies.
    """

    flops_per_s: float
    size: int
    threads: int
    device: str
    repeats: int
    dtype: str = "float32"

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """One line for the table's footer."""
        short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(self.dtype, self.dtype)
        return (
            f"{short} matmul peak {self.flops_per_s / 1e9:,.1f} GFLOP/s "
            f"(best of {self.repeats} torch.mm {self.size}x{self.size}, {self.device}, {self.threads} threads)"
        )


def measure_matmul_peak(
    device: str = "cpu", threads: int = 2, size: int = 4096, repeats: int = 3, dtype: torch.dtype = torch.float32
) -> MatmulPeak:
    """Time ``repeats`` ``torch.mm`` of ``size x size`` matrices of ``dtype`` after one untimed one.

    Args:
        device: where to multiply (``cpu``, ``cuda``, ``cuda:N``).
        threads: CPU threads to use (restored afterwards).
        size: side of the square operands (at least 1).
        repeats: timed multiplies (at least 1); the fastest one counts.
        dtype: the operands' dtype (float32, or the autocast dtype of the cases).

    Returns:
        :class:`MatmulPeak` with ``flops_per_s = 2 size^3 / best seconds``.
    """
    if size < 1 or repeats < 1:
        raise ValueError(f"size and repeats must be at least 1, got {size} and {repeats}")
    dev = torch.device(device)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(size, size, generator=g).to(dev, dtype)
        b = torch.randn(size, size, generator=g).to(dev, dtype)
        out = torch.empty(size, size, device=dev, dtype=dtype)

        def sync() -> None:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        torch.mm(a, b, out=out)  # untimed: allocations, BLAS thread start-up
        sync()
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            sync()
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return MatmulPeak(
        flops_per_s=2 * size**3 / best,
        size=size,
        threads=threads,
        device=str(dev),
        repeats=repeats,
        dtype=str(dtype).removeprefix("torch."),
    )


def add_peak_fractions(results: list[dict], peak: MatmulPeak | dict[str, MatmulPeak]) -> list[dict]:
    """Set ``peak_fraction`` (achieved FLOP/s / peak, None without a FLOP count) on every row.

    Args:
        results: bench rows (with ``achieved_flops_per_s`` and ``amp``).
        peak: one peak for every row, or one per autocast (``none``, ``bf16``,
            ``fp16``): each row is then compared with the peak of the dtype it
            computed in.
    """
    for row in results:
        chosen = peak if isinstance(peak, MatmulPeak) else peak[row.get("amp", "none")]
        achieved = row.get("achieved_flops_per_s")
        row["peak_fraction"] = None if achieved is None else achieved / chosen.flops_per_s
    return results
