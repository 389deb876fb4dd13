"""The bench worker compiles a case when its config says ``train.compile=true``, as ``--compile`` does."""

from __future__ import annotations

import pytest
import torch

from detr_peg.lab.benchmark import worker
from tests.engine.tiny_run import TINY_MODEL
from tests.lab.benchmark.tiny_case import tiny_case


@pytest.mark.parametrize(
    ("flag", "overrides", "compiled"),
    [
        (False, [], False),
        (False, ["train.compile=true"], True),
        (True, [], True),
    ],
)
def test_config_compile_is_honoured(monkeypatch, flag: bool, overrides: list[str], compiled: bool) -> None:
    calls = []

    def recording_compile(fn, *args, **kwargs):
        calls.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", recording_compile)
    case = tiny_case(overrides=[*TINY_MODEL, *overrides], compile=flag)
    result = worker.run_case(case)
    assert result["compile"] is compiled
    assert len(calls) == int(compiled)
    # FLOPs are counted on eager models only.
    assert (result["flops"] is None) is compiled
