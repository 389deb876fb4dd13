"""Planning and running benchmark cases, each in a fresh subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from typing import Iterable

from tqdm import tqdm

from detr_peg.benchmark.worker import Case
from detr_peg.errors import ConfigError, UserError

RESULT_PREFIX = "BENCH_RESULT "


def parse_size(text: str) -> tuple[int, int]:
    """``"800x1066"`` -> ``(800, 1066)`` (height x width)."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"Size {text!r} is not HEIGHTxWIDTH (for example 800x1066).") from None
    if h < 32 or w < 32:
        raise ConfigError(f"Size {text!r} is too small; both sides must be at least 32.")
    return h, w


def parse_compare(text: str | None) -> tuple[str, list[str]] | None:
    """``"model.position.name=sine,peg"`` -> ``("model.position.name", ["sine", "peg"])``."""
    if not text:
        return None
    key, sep, values = text.partition("=")
    options = [v for v in values.split(",") if v]
    if not sep or not key or len(options) < 2:
        raise ConfigError(f"--compare {text!r} must be KEY=VALUE1,VALUE2[,...] (for example model.position.name=sine,peg).")
    return key, options


def plan_cases(base: Case, *, modes: Iterable[str], sizes: dict[str, tuple[int, int]],
               compare: tuple[str, list[str]] | None, official_repo: str | None,
               official_args: list[str]) -> list[Case]:
    """One case per (mode, compared value), plus the official code's case per mode."""
    cases = []
    for mode in modes:
        h, w = sizes[mode]
        sized = replace(base, mode=mode, height=h, width=w)
        if official_repo:
            cases.append(replace(sized, label="official", impl="official", official_repo=official_repo,
                                 config=None, overrides=list(official_args), compile=False, amp="none"))
        if compare is None:
            cases.append(replace(sized, label="detr_peg"))
        else:
            key, values = compare
            for value in values:
                cases.append(replace(sized, label=f"{key.rsplit('.', 1)[-1]}={value}",
                                     overrides=[*base.overrides, f"{key}={value}"]))
    return cases


def run_case_subprocess(case: Case, timeout: float | None = None) -> dict:
    """Run one case with ``python -m detr_peg.benchmark.worker`` and parse its result."""
    env = dict(os.environ, OMP_NUM_THREADS=str(case.threads), MKL_NUM_THREADS=str(case.threads))
    proc = subprocess.run(
        [sys.executable, "-m", "detr_peg.benchmark.worker", json.dumps(asdict(case))],
        capture_output=True, text=True, env=env, timeout=timeout,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise UserError(f"Benchmark case '{case.label}' ({case.mode}) failed: {last}")


def run_cases(cases: list[Case], progress: bool = True) -> list[dict]:
    """Run every case in order (one at a time, so they do not compete for the CPU)."""
    results = []
    with tqdm(cases, desc="bench", unit="case", disable=not progress) as bar:
        for case in bar:
            bar.set_postfix_str(f"{case.label} {case.mode} {case.height}x{case.width}")
            results.append(run_case_subprocess(case))
    return results
