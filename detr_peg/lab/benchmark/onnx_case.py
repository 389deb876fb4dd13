"""The ONNX Runtime case of ``detr-peg bench``: the same model, exported and run on the CPU.

``detr-peg bench --onnx`` adds, after every PyTorch inference case, one case
labelled ``<label> onnxruntime``, measured by ``python -m
detr_peg.lab.benchmark.onnx_case CASE_JSON`` (:func:`main`):

1. a child process (``python -m detr_peg.lab.benchmark.worker CASE_JSON --export
   PATH``) builds the model the PyTorch case builds (same config, same random
   weights: the same seed) and exports it with
   :func:`~detr_peg.export.onnx_export.export_onnx` (dynamic batch and size,
   the graph ``detr-peg export`` writes) into a temporary folder;
2. this process opens it in an ONNX Runtime CPU session with the options of
   :func:`~detr_peg.export.onnx_session.session_options` (those of
   :class:`~detr_peg.export.onnx_runtime.OnnxDetector`) and ``--threads``
   intra-op threads, and times ``session.run`` on a random batch of the
   case's size (NumPy arrays, no padding), as the PyTorch case times the model.

This process imports ONNX Runtime and NumPy but never torch, as a deployment
with ONNX Runtime does, and the export's memory stays in the child: the
case's peak memory is the interpreter, ONNX Runtime, the session and its runs.
The PyTorch case's peak includes torch and the models' modules, which it
needs. No FLOPs are counted (the graph is the same model).
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
    """Export the model of ``case`` (an ONNX case as a dict) to ``path`` in a child process.

    Returns:
        The model's parameter count.

    Raises:
        RuntimeError: the export failed; the message ends with the child's exception line, and its
            whole error output is repeated on this process's stderr (the runner keeps it in a log).
    """
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
    """Time the exported graph at ``path`` as ``case`` says; returns the case with its measurements.

    Args:
        case: the ONNX case (``worker.Case`` as a dict: ``batch``, ``height``,
            ``width``, ``threads``, ``warmup``, ``runs``, ...).
        path: the exported graph.
        parameters: the model's parameter count, for the report (None: counted by an earlier round).
    """
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
    """``CASE_JSON``: export the case's model (in a child process), then time it here.

    With ``onnx_model`` in the case, the graph there is timed when the file exists (a later round of
    ``--rounds``: its parameter count is the first round's, so None here) and exported there first when it
    does not; without it, into a temporary folder for this run only.
    """
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
