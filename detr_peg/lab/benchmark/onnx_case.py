"""The ONNX Runtime case of ``detr-peg bench --onnx``: the model exported in a child process, timed here on the CPU.

This process never imports torch, as a deployment with ONNX Runtime does.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from detr_peg.engine.memory_allocator import retain_freed_memory
from detr_peg.lab.benchmark.protocol import EXPORT_FLAG, ONNX_IMPL, PARAMETERS_PREFIX, RESULT_PREFIX, failure_line
from detr_peg.lab.benchmark.timing import cpu_name, peak_rss_bytes, time_runs

__all__ = ["export_model", "main", "run_onnx_case"]


def export_model(case: dict, path: Path) -> int:
    """Export ``case``'s model to ``path`` in a child process; its parameter count (``RuntimeError`` on failure)."""
    model_case = {**case, "impl": "detr_peg", "label": case["label"].removesuffix(f" {ONNX_IMPL}")}
    proc = subprocess.run(
        [sys.executable, "-m", "detr_peg.lab.benchmark.worker", json.dumps(model_case), EXPORT_FLAG, str(path)],
        capture_output=True,
        text=True,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(PARAMETERS_PREFIX)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr)
        raise RuntimeError(
            f"exporting the model of case '{case['label']}' failed (exit status {proc.returncode}): "
            f"{failure_line(proc.stderr)}"
        )
    return int(lines[-1][len(PARAMETERS_PREFIX) :])


def run_onnx_case(case: dict, path: Path, parameters: int | None) -> dict:
    """Time the graph at ``path`` on a random batch of the case's size; the case with its measurements."""
    import numpy as np
    import onnxruntime as ort

    from detr_peg.export.onnx_session import session_options

    session = ort.InferenceSession(str(path), session_options(case["threads"]), providers=["CPUExecutionProvider"])
    shape = (case["batch"], case["height"], case["width"])
    feed = {
        "images": np.random.default_rng(0).standard_normal((shape[0], 3, *shape[1:]), dtype=np.float32),
        "mask": np.zeros(shape, dtype=np.bool_),
    }
    timing = time_runs(lambda: session.run(None, feed), warmup=case["warmup"], runs=case["runs"])
    return {
        **case,
        "amp": "none",
        "compile": False,
        "seconds": timing.median,
        "runs_seconds": timing.runs,
        "peak_memory_bytes": peak_rss_bytes(),
        "flops": None,
        "achieved_flops_per_s": None,
        "parameters": parameters,
        "torch_version": None,
        "onnxruntime_version": ort.__version__,
        "device_name": cpu_name(),
    }


def main(argv: list[str] | None = None) -> int:
    """``CASE_JSON``: export the case's model (to ``onnx_model`` if missing, else a temporary file), then time it."""
    argv = sys.argv[1:] if argv is None else argv
    case = json.loads(argv[0])
    retain_freed_memory()  # as in every other case
    with contextlib.ExitStack() as stack:
        if case.get("onnx_model"):
            path = Path(case["onnx_model"])
        else:
            path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="detr_peg_bench_"))) / "model.onnx"
        parameters = None if path.is_file() else export_model(case, path)
        result = run_onnx_case(case, path, parameters)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
