"""The benchmark table and JSON report."""

from __future__ import annotations

import json
import os
from pathlib import Path

from detr_peg.outputs import atomic_write_text, make_folder


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def add_ratios(results: list[dict]) -> list[dict]:
    """Per mode: ``ratio`` = time / time of the first row; ``speedup`` = its inverse."""
    baselines: dict[str, float] = {}
    for row in results:
        base = baselines.setdefault(row["mode"], row["seconds"])
        row["ratio_to_baseline"] = row["seconds"] / base
        row["speedup_vs_baseline"] = base / row["seconds"]
    return results


def format_table(results: list[dict], peak_line: str | None = None) -> str:
    """A plain-text table, one row per case (``% peak`` when rows carry ``peak_fraction``)."""
    with_peak = any("peak_fraction" in r for r in results)
    with_amp = len({r.get("amp", "none") for r in results}) > 1
    header = ["case", "mode"] + (["amp"] if with_amp else []) + ["input", "median s", "runs (s)", "peak mem"]
    header += ["GFLOPs", "TFLOP/s"]
    header += ["% peak"] if with_peak else []
    header += ["x baseline"]
    rows = [header]
    for r in results:
        fraction = r.get("peak_fraction")
        percent = (["-" if fraction is None else f"{100 * fraction:.0f}%"]) if with_peak else []
        rows.append(
            [
                r["label"],
                r["mode"],
                *([r.get("amp", "none")] if with_amp else []),
                f"{r['batch']}x{r['height']}x{r['width']}",
                f"{r['seconds']:.3f}",
                " ".join(f"{t:.2f}" for t in r["runs_seconds"]),
                _mib(r["peak_memory_bytes"]),
                "-" if r["flops"] is None else f"{r['flops'] / 1e9:,.1f}",
                "-" if r["achieved_flops_per_s"] is None else f"{r['achieved_flops_per_s'] / 1e12:.3f}",
                *percent,
                f"{r['speedup_vs_baseline']:.2f}x faster"
                if r["speedup_vs_baseline"] >= 1
                else f"{r['ratio_to_baseline']:.3f}x time",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    first = results[0] if results else {}
    runtimes = [f"torch {first.get('torch_version', '?')}"]
    runtimes += sorted({f"onnxruntime {r['onnxruntime_version']}" for r in results if r.get("onnxruntime_version")})
    footer = (
        f"device: {first.get('device_name', '?')} ({first.get('device', '?')}, "
        f"{first.get('threads', '?')} threads), {', '.join(runtimes)}, "
        f"amp {', '.join(sorted({r.get('amp', 'none') for r in results})) or 'none'}; medians of {len(first.get('runs_seconds', [])) or '?'} runs "
        f"({first.get('rounds', 1)} rounds of {first.get('runs', '?')} after {first.get('warmup', '?')} warm-up)"
    )
    return "\n".join(lines + ["", footer] + ([peak_line] if peak_line else []))


def write_json(
    results: list[dict],
    path: str | os.PathLike,
    matmul_peak: dict | None = None,
    matmul_peaks: dict[str, dict] | None = None,
) -> None:
    """Write ``{"results", "matmul_peak", "matmul_peaks" (one per autocast, if several)}`` to ``path`` atomically."""
    path = Path(path)
    make_folder(path.parent)
    report: dict = {"results": results}
    if matmul_peak is not None:
        report["matmul_peak"] = matmul_peak
    if matmul_peaks is not None:
        report["matmul_peaks"] = matmul_peaks
    atomic_write_text(path, json.dumps(report, indent=2))
