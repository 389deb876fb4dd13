"""The matrix-multiply peak that bench rows are compared with."""

from __future__ import annotations

import pytest
import torch

from detr_peg.lab.benchmark.matmul_peak import MatmulPeak, add_peak_fractions, measure_matmul_peak


def test_peak_is_two_n_cubed_over_the_best_time_and_threads_are_restored(monkeypatch) -> None:
    times = iter([10.0, 10.5, 20.0, 20.25, 30.0, 30.4])  # three timed multiplies: 0.5 s, 0.25 s, 0.4 s
    monkeypatch.setattr("detr_peg.lab.benchmark.matmul_peak.time.perf_counter", lambda: next(times))
    before = torch.get_num_threads()
    peak = measure_matmul_peak("cpu", threads=1, size=64, repeats=3)
    assert torch.get_num_threads() == before
    assert peak == MatmulPeak(flops_per_s=2 * 64**3 / 0.25, size=64, threads=1, device="cpu", repeats=3)
    assert peak.describe() == "fp32 matmul peak 0.0 GFLOP/s (best of 3 torch.mm 64x64, cpu, 1 threads)"


def test_a_real_measurement_is_a_positive_rate() -> None:
    peak = measure_matmul_peak("cpu", threads=1, size=128, repeats=2)
    assert peak.flops_per_s > 0 and peak.to_dict()["size"] == 128


def test_fractions_are_achieved_over_peak_and_none_without_flops() -> None:
    peak = MatmulPeak(flops_per_s=100e9, size=4096, threads=2, device="cpu", repeats=3)
    rows = add_peak_fractions([{"achieved_flops_per_s": 25e9}, {"achieved_flops_per_s": None}], peak)
    assert rows[0]["peak_fraction"] == pytest.approx(0.25) and rows[1]["peak_fraction"] is None


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="size and repeats must be at least 1"):
        measure_matmul_peak(size=0)
