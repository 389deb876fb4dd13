"""The machine's matrix-multiply peak (best ``torch.mm`` of ``N x N`` operands), measured in the bench run itself."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch


@dataclass
class MatmulPeak:
    """A measured matrix-multiply peak: ``flops_per_s`` of ``size`` operands with ``threads`` on ``device``."""

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
    """Best ``2 size^3 / seconds`` of ``repeats`` ``torch.mm`` in ``dtype`` after an untimed one; restores threads."""
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
    """Set ``peak_fraction`` (achieved / peak FLOP/s); ``peak`` may be a dict by autocast, matched to each ``amp``."""
    for row in results:
        chosen = peak if isinstance(peak, MatmulPeak) else peak[row.get("amp", "none")]
        achieved = row.get("achieved_flops_per_s")
        row["peak_fraction"] = None if achieved is None else achieved / chosen.flops_per_s
    return results
