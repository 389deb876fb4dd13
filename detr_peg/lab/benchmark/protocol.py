"""The lines the processes of ``detr-peg bench`` print to each other (torch-free)."""

from __future__ import annotations

import re

#: The ``impl`` of an ONNX Runtime case (and the end of its label).
ONNX_IMPL = "onnxruntime"
#: ``python -m detr_peg.lab.benchmark.worker CASE_JSON --export PATH`` exports the case's model to ``PATH``.
EXPORT_FLAG = "--export"
#: The line the exporting process prints: the exported model's parameter count.
PARAMETERS_PREFIX = "BENCH_PARAMETERS "
#: The line a case process prints: the case's measurements as JSON.
RESULT_PREFIX = "BENCH_RESULT "

# The line a Python traceback ends with: "package.module.SomeError: message".
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: .*)?$")


def failure_line(stderr: str) -> str:
    """The exception line of a failed process's error output (its last line when there is none)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return line
    return lines[-1] if lines else "no output"
