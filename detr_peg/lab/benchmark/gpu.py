"""``detr-peg bench --gpu``: images/s on CUDA under bf16 and torch.compile, one row per attention implementation."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from detr_peg.errors import ConfigError
from detr_peg.lab.benchmark.worker import Case
from detr_peg.models.registry import MODELS

#: What ``--gpu`` sets on every case.
GPU_SETTINGS = {"device": "cuda", "amp": "bf16", "compile": True}


def require_cuda() -> None:
    """Raise a one-line :class:`ConfigError` unless torch sees a CUDA device."""
    import torch

    if not torch.cuda.is_available():
        build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        raise ConfigError(
            f"--gpu needs a CUDA device, but torch {torch.__version__} ({build}) sees none on this "
            "machine; run it where nvidia-smi lists a GPU, or drop --gpu to measure the CPU."
        )


def plan_gpu_cases(
    base: Case,
    *,
    modes: Iterable[str],
    sizes: dict[str, tuple[int, int]],
    official_repo: str | None,
    official_args: list[str],
) -> list[Case]:
    """Per mode: the official case (when given), then one detr_peg case per attention implementation."""
    base = replace(base, **GPU_SETTINGS)
    architecture = MODELS.get(base.arch)
    impls = (architecture.attention.compared_on_gpu if architecture.attention else ()) or (None,)
    cases = []
    for mode in modes:
        h, w = sizes[mode]
        sized = replace(base, mode=mode, height=h, width=w)
        if official_repo:
            label = architecture.official.gpu_label if architecture.official else "official"
            cases.append(
                replace(
                    sized,
                    label=label,
                    impl="official",
                    official_repo=official_repo,
                    config=None,
                    overrides=list(official_args),
                )
            )
        for impl in impls:
            cases.append(replace(sized, label="detr_peg" if impl is None else f"detr_peg {impl}", attention_impl=impl))
    return cases


def add_throughput(results: list[dict]) -> list[dict]:
    """Add ``images_per_s`` (batch / median seconds per step) to every result."""
    for row in results:
        row["images_per_s"] = row["batch"] / row["seconds"]
    return results


def format_throughput(results: list[dict]) -> str:
    """Images/s per case and mode, relative to the first row of each mode."""
    header = ["case", "mode", "input", "images/s", "x first row"]
    rows = [header]
    first: dict[str, float] = {}
    for r in results:
        base = first.setdefault(r["mode"], r["images_per_s"])
        mode = "training" if r["mode"] == "train" else "inference"
        rows.append(
            [
                r["label"],
                mode,
                f"{r['batch']}x{r['height']}x{r['width']}",
                f"{r['images_per_s']:,.1f}",
                f"{r['images_per_s'] / base:.2f}x",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(["images/s (bf16 autocast, torch.compile):", *lines])
