"""Planning and running benchmark cases, each in a fresh subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, replace
from pathlib import Path

from tqdm import tqdm

from detr_peg.errors import ConfigError, UserError
from detr_peg.lab.benchmark.protocol import ONNX_IMPL, RESULT_PREFIX, failure_line
from detr_peg.lab.benchmark.worker import Case


def plan_cases(
    base: Case,
    *,
    modes: Iterable[str],
    sizes: dict[str, tuple[int, int]],
    compare: tuple[str, list[str]] | None,
    official_repo: str | None,
    official_args: list[str],
    onnx: bool = False,
) -> list[Case]:
    """A case per (mode, compared value), the official case per mode, with ``onnx`` an ONNX case per inference case."""
    cases = []
    for mode in modes:
        h, w = sizes[mode]
        sized = replace(base, mode=mode, height=h, width=w)
        if official_repo:
            cases.append(
                replace(
                    sized,
                    label="official",
                    impl="official",
                    official_repo=official_repo,
                    config=None,
                    overrides=list(official_args),
                    compile=False,
                    amp="none",
                )
            )
        if compare is None:
            own = [replace(sized, label="detr_peg")]
        else:
            key, values = compare
            own = [
                replace(sized, label=f"{key.rsplit('.', 1)[-1]}={value}", overrides=[*base.overrides, f"{key}={value}"])
                for value in values
            ]
        for case in own:
            cases.append(case)
            if onnx and mode == "infer":
                cases.append(
                    replace(
                        case, label=f"{case.label} onnxruntime", impl=ONNX_IMPL, flops=False, compile=False, amp="none"
                    )
                )
    return cases


def run_case_subprocess(case: Case) -> dict:
    """Run one case in a fresh ``worker`` (or torch-free ``onnx_case``) process and parse its result."""
    env = dict(os.environ, OMP_NUM_THREADS=str(case.threads), MKL_NUM_THREADS=str(case.threads))
    module = "detr_peg.lab.benchmark.onnx_case" if case.impl == ONNX_IMPL else "detr_peg.lab.benchmark.worker"
    proc = subprocess.run(
        [sys.executable, "-m", module, json.dumps(asdict(case))],
        capture_output=True,
        text=True,
        env=env,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    fd, log = tempfile.mkstemp(prefix="detr-peg-bench-", suffix=".log")
    with os.fdopen(fd, "w") as file:
        file.write(proc.stderr)
    raise UserError(
        f"Benchmark case '{case.label}' ({case.mode}) failed: {failure_line(proc.stderr)}; "
        f"its full error output is in {log}"
    )


def run_cases(cases: list[Case], progress: bool = True, rounds: int = 1) -> list[dict]:
    """Run every case in order, one at a time; ``rounds > 1`` pools each case's runs over rounds (FLOPs: round 1)."""
    if rounds < 1:
        raise ConfigError(f"--rounds must be at least 1, got {rounds}.")
    with contextlib.ExitStack() as stack:
        if rounds > 1 and any(case.impl == ONNX_IMPL for case in cases):
            # An ONNX case's graph is exported in the first round and timed again in the later ones.
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="detr_peg_bench_")))
            cases = [
                replace(case, onnx_model=str(folder / f"case{i}.onnx")) if case.impl == ONNX_IMPL else case
                for i, case in enumerate(cases)
            ]
        results = _run_rounds(cases, progress, rounds)
    for result in results:
        result.pop("onnx_model", None)  # a working file of this run, gone with it
    return results


def _run_rounds(cases: list[Case], progress: bool, rounds: int) -> list[dict]:
    """Each case's result, its later rounds' runs merged into its first (:func:`merge_round`)."""
    results: list[dict] = []
    with tqdm(total=len(cases) * rounds, desc="bench", unit="case", disable=not progress) as bar:
        for round_index in range(rounds):
            for i, case in enumerate(cases):
                bar.set_postfix_str(f"{case.label} {case.mode} {case.height}x{case.width}")
                if round_index == 0:
                    results.append(run_case_subprocess(case))
                else:
                    merge_round(results[i], run_case_subprocess(replace(case, flops=False)))
                bar.update()
    return results


def merge_round(pooled: dict, new: dict) -> None:
    """Add the runs of a later round of one case to its result."""
    pooled["runs_seconds"] = pooled["runs_seconds"] + new["runs_seconds"]
    pooled["seconds"] = statistics.median(pooled["runs_seconds"])
    pooled["rounds"] = pooled.get("rounds", 1) + 1
    if new["peak_memory_bytes"] is not None:
        pooled["peak_memory_bytes"] = max(pooled["peak_memory_bytes"] or 0, new["peak_memory_bytes"])
    if pooled["flops"]:
        pooled["achieved_flops_per_s"] = pooled["flops"] / pooled["seconds"]
