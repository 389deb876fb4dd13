"""The ONNX Runtime case of ``detr-peg bench``: the graph it times is the model the PyTorch case times
(same config, same random weights), exported by a child process, and it is timed in a process that
never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from detr_peg.export.onnx_runtime import OnnxDetector
from detr_peg.lab.benchmark import worker
from detr_peg.lab.benchmark.onnx_case import export_model
from detr_peg.lab.benchmark.protocol import ONNX_IMPL, RESULT_PREFIX
from tests.conftest import REPO_ROOT
from tests.lab.benchmark.tiny_case import tiny_case

#: The module exports a model in a child process.
pytestmark = pytest.mark.slow

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
        "import json, sys; from pathlib import Path; from detr_peg.lab.benchmark.onnx_case import run_onnx_case; "
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


def test_a_graph_kept_across_rounds_is_exported_once_and_timed_again(exported, tmp_path, monkeypatch, capsys):
    from detr_peg.lab.benchmark import onnx_case

    path, parameters = exported
    kept = tmp_path / "case0.onnx"
    kept.write_bytes(path.read_bytes())  # what the first round left there
    monkeypatch.setattr(onnx_case, "export_model", lambda *a: pytest.fail("exported again"))
    case = {**asdict(CASE), "onnx_model": str(kept)}
    assert onnx_case.main([json.dumps(case)]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1].removeprefix(RESULT_PREFIX))
    assert result["parameters"] is None and len(result["runs_seconds"]) == 2  # counted by the first round
    assert kept.is_file()  # kept for the next round; the run's temporary folder removes it


def test_rounds_give_every_onnx_case_one_graph_file_for_the_run(monkeypatch, tmp_path):
    from detr_peg.lab.benchmark import runner

    seen = []

    def fake(case, timeout=None):
        seen.append(case)
        return {**asdict(case), "runs_seconds": [1.0], "seconds": 1.0, "peak_memory_bytes": 1, "flops": None}

    monkeypatch.setattr(runner, "run_case_subprocess", fake)
    torch_case = replace(CASE, impl="detr_peg", label="tiny")
    results = runner.run_cases([torch_case, CASE], progress=False, rounds=3)
    onnx = [c.onnx_model for c in seen if c.impl == ONNX_IMPL]
    assert len(onnx) == 3 and len(set(onnx)) == 1 and onnx[0].endswith("case1.onnx")  # the same file each round
    assert all(c.onnx_model is None for c in seen if c.impl != ONNX_IMPL)
    assert [r["rounds"] for r in results] == [3, 3] and all("onnx_model" not in r for r in results)
    assert not Path(onnx[0]).parent.exists()  # the run's folder is removed
    # One round: no file kept, each ONNX case exports into a folder of its own.
    seen.clear()
    runner.run_cases([CASE], progress=False, rounds=1)
    assert seen[0].onnx_model is None
