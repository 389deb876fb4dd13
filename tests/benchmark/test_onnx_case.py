"""The ONNX Runtime case of ``detr-peg bench``: the graph it times is the model the PyTorch case times
(same config, same random weights), exported by a child process, and it is timed in a process that
never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from detr_peg.benchmark import worker
from detr_peg.benchmark.onnx_case import export_model
from detr_peg.benchmark.protocol import ONNX_IMPL
from detr_peg.export.onnx_runtime import OnnxDetector
from tests.benchmark.tiny_case import tiny_case
from tests.conftest import REPO_ROOT

CASE = tiny_case(
    label="tiny onnxruntime",
    impl=ONNX_IMPL,
    config=str(REPO_ROOT / "configs" / "detr_r50_peg.yaml"),
    width=96,
    batch=2,
    runs=2,
    flops=False,
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``(path, parameters)`` of CASE's model, exported once (an export takes seconds even for a tiny model)."""
    path = tmp_path_factory.mktemp("onnx_case") / "model.onnx"
    return path, export_model(asdict(CASE), path)


def test_the_exported_graph_is_the_pytorch_case_model(exported):
    path, parameters = exported
    torch.manual_seed(0)  # as run_case does before building
    model = worker._build(replace(CASE, impl="detr_peg", label="tiny"), torch.device("cpu")).model.eval()
    assert parameters == sum(p.numel() for p in model.parameters())
    images, mask = torch.randn(2, 3, 64, 96), torch.zeros(2, 64, 96, dtype=torch.bool)
    mask[1, 40:, :] = True
    with torch.no_grad():
        expected = model(images, mask)
    got = OnnxDetector(path)(images, mask)
    for key in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=1e-4)


def test_the_graph_is_timed_without_torch(exported):
    path, parameters = exported
    script = (
        "import json, sys; from pathlib import Path; from detr_peg.benchmark.onnx_case import run_onnx_case; "
        f"r = run_onnx_case(json.loads(sys.argv[1]), Path(sys.argv[2]), {parameters}); "
        "r['torch_imported'] = 'torch' in sys.modules; print(json.dumps(r))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(asdict(CASE)), str(path)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["torch_imported"] is False
    assert (result["label"], result["impl"], result["parameters"]) == ("tiny onnxruntime", ONNX_IMPL, parameters)
    assert len(result["runs_seconds"]) == 2 and result["seconds"] > 0 and result["flops"] is None
    # The process's own peak (ONNX Runtime and a tiny graph), not torch's libraries or the pytest process's.
    assert 0 < result["peak_memory_bytes"] < 400 * 2**20
