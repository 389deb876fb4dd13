"""A benchmark case that fails: one line naming the exception, and the whole error output kept."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from detr_peg.errors import UserError
from detr_peg.lab.benchmark.protocol import failure_line
from detr_peg.lab.benchmark.runner import run_case_subprocess
from detr_peg.lab.benchmark.worker import Case

COMPILE_FAILURE = """\
W1123 22:01:10.606000 4072 torch/_dynamo/variables/tensor.py:1841] [0/0]     total = int(x.sum())
Traceback (most recent call last):
  File "worker.py", line 3, in <module>
    main()
torch._dynamo.exc.TorchRuntimeError: RuntimeError when making fake tensor call
  Explanation: Dynamo failed to run FX node with fake tensors

from user code:
   File "decoder.py", line 118, in forward

Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please do this especially if you're reporting a bug).
"""


def test_the_exception_line_is_found_before_trailing_hints() -> None:
    assert (
        failure_line(COMPILE_FAILURE)
        == "torch._dynamo.exc.TorchRuntimeError: RuntimeError when making fake tensor call"
    )
    assert failure_line("Traceback (most recent call last):\n  ...\nKeyboardInterrupt\n") == "KeyboardInterrupt"
    assert failure_line("some tool said: giving up\n\n") == "some tool said: giving up"
    assert failure_line("") == "no output"


def test_a_failing_case_names_its_exception_and_keeps_the_output(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    case = Case(label="broken", impl="detr_peg", mode="infer", config=str(missing), runs=1, warmup=0, flops=False)
    with pytest.raises(UserError) as raised:
        run_case_subprocess(case)
    message = str(raised.value)
    assert message.startswith("Benchmark case 'broken' (infer) failed: ")
    assert str(missing) in message.splitlines()[0]
    log = Path(re.search(r"; its full error output is in (\S+)$", message).group(1))
    try:
        text = log.read_text()
        assert "Traceback (most recent call last)" in text and str(missing) in text
    finally:
        log.unlink()
