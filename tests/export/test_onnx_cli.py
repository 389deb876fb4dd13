"""The command line around ONNX: ``export``, ``predict --onnx`` against ``predict --checkpoint``,
``bench --onnx``, and the one-line error when the optional packages are missing."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from detr_peg.checkpoint.format import save_checkpoint
from detr_peg.cli.main import main
from detr_peg.config import load_config
from detr_peg.models import build_model
from tests.conftest import CLI, run_python
from tests.engine.tiny_run import TINY_MODEL

#: Exports, and benchmarks an export.
pytestmark = pytest.mark.slow

needs_onnx = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("onnx", "onnxscript", "onnxruntime")),
    reason="the optional onnx packages are not installed",
)

LABEL_MAP = {"category_ids": [2, 7, 11], "names": ["circle", "square", "triangle"], "contiguous": True}
SMALL_EVAL = ["data.val_scale=96", "data.val_max_size=160"]


def _checkpoint(folder: Path) -> Path:
    cfg = load_config(None, [*TINY_MODEL, "model.num_classes=3", "model.position.name=peg", *SMALL_EVAL])
    torch.manual_seed(0)
    model = build_model(cfg)
    with torch.no_grad():  # a confident class head, so that detections differ between images
        model.class_embed.weight.mul_(20)
    path = folder / "checkpoint.pth"
    save_checkpoint(path, cfg, model.state_dict(), LABEL_MAP)
    return path


def _images(folder: Path) -> Path:
    folder.mkdir()
    g = torch.Generator().manual_seed(0)
    for name, (h, w) in {"a.png": (120, 90), "b.png": (70, 140), "c.jpg": (100, 100)}.items():
        pixels = (torch.rand(h, w, 3, generator=g) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(folder / name)
    return folder


@needs_onnx
def test_export_then_predict_with_onnx_gives_the_files_of_the_pytorch_path(tmp_path, capsys):
    checkpoint = _checkpoint(tmp_path)
    graph = tmp_path / "model.onnx"
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(graph)]) == 0
    out = capsys.readouterr().out
    # Said before the export starts, which takes minutes for a full-size model on a CPU.
    assert (
        out.splitlines()[0] == f"exporting detr to {graph} with dynamic batch and size (can take minutes on a CPU) ..."
    )
    assert "checked in ONNX Runtime against PyTorch" in out
    images = _images(tmp_path / "images")
    common = [str(images), "--score-threshold", "0", "--batch-size", "2"]
    assert main(["predict", "--checkpoint", str(checkpoint), *common, "--output", str(tmp_path / "pt")]) == 0
    assert main(["predict", "--onnx", str(graph), *common, "--output", str(tmp_path / "ort")]) == 0

    torch_records = json.loads((tmp_path / "pt" / "predictions.json").read_text())
    onnx_records = json.loads((tmp_path / "ort" / "predictions.json").read_text())
    assert len(onnx_records) == len(torch_records) == 3 * 8  # 8 queries per image, threshold 0
    assert {r["category_name"] for r in onnx_records} <= set(LABEL_MAP["names"])
    for got, want in zip(onnx_records, torch_records):
        assert {k: got[k] for k in ("image_id", "file_name", "category_id", "category_name")} == {
            k: want[k] for k in ("image_id", "file_name", "category_id", "category_name")
        }
        assert got["score"] == pytest.approx(want["score"], abs=2e-5)
        assert got["bbox"] == pytest.approx(want["bbox"], abs=0.02)
    pictures = sorted(p.name for p in (tmp_path / "ort").glob("*.png"))
    assert pictures == sorted(p.name for p in (tmp_path / "pt").glob("*.png")) == ["a.png", "b.png", "c.png"]


@needs_onnx
def test_bench_adds_an_onnx_runtime_case(tmp_path):
    report = tmp_path / "bench.json"
    proc = run_python(
        *CLI, "bench", "--config", "configs/detr_r50_peg.yaml", *TINY_MODEL, "--modes", "infer",
        "--infer-size", "96x128", "--runs", "2", "--threads", "1", "--warmup", "1", "--peak-size", "0", "--onnx",
        "--output", str(report),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(report.read_text())["results"]
    assert [(r["label"], r["impl"]) for r in results] == [
        ("detr_peg", "detr_peg"),
        ("detr_peg onnxruntime", "onnxruntime"),
    ]
    onnx_row = results[1]
    assert onnx_row["flops"] is None and len(onnx_row["runs_seconds"]) == 2 and onnx_row["seconds"] > 0
    assert onnx_row["parameters"] == results[0]["parameters"]  # the model of the PyTorch case, exported
    assert onnx_row["ratio_to_baseline"] == pytest.approx(onnx_row["seconds"] / results[0]["seconds"])
    assert "detr_peg onnxruntime" in proc.stdout


def test_missing_onnx_packages_are_one_line_errors(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a, **k: None if name == "onnxruntime" else real(name, *a, **k)
    )
    assert main(["export", "--checkpoint", str(tmp_path / "missing.pth"), "--output", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert (
        "need the optional packages onnxruntime" in err
        and "pip install onnx onnxscript onnxruntime (the 'onnx' extra of detr_peg)" in err
    )
    images = _images(tmp_path / "images")
    assert main(["predict", "--onnx", str(tmp_path / "m.onnx"), str(images)]) == 2
    assert "pip install onnx onnxscript onnxruntime (the 'onnx' extra of detr_peg)" in capsys.readouterr().err


@needs_onnx
@pytest.mark.parametrize(
    "options, message",
    [
        (["--opset", "999"], "--opset must be a whole number from 18 (the tested one) to"),
        (["--opset", "17"], "argument --opset: must be a whole number of at least 18, got '17'"),
        (["--image-size", "100000", "64"], "argument --image-size: must be a whole number from 32 to 8192"),
        (
            ["--image-size", "64", "64", "--batch-size", "10000000000"],
            "--batch-size must be a whole number from 1 to 100000",
        ),
        (["--batch-size", "0"], "argument --batch-size: must be a whole number of at least 1, got '0'"),
    ],
)
def test_export_options_beyond_what_can_be_written_are_refused_before_reading(tmp_path, capsys, options, message):
    """Refused before the checkpoint is read (it does not exist here) and before anything is written."""
    args = ["export", "--checkpoint", str(tmp_path / "missing.pth"), "--output", str(tmp_path / "m.onnx"), *options]
    assert main(args) == 2  # argparse's own refusals too
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err
    assert list(tmp_path.iterdir()) == []


@needs_onnx
def test_a_graph_that_fails_its_check_does_not_replace_an_earlier_export(tmp_path, monkeypatch, capsys):
    """The ONNX Runtime check runs on the new graph before it replaces --output."""
    import detr_peg.export.onnx_runtime as onnx_runtime

    checkpoint, graph = _checkpoint(tmp_path), tmp_path / "model.onnx"
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(graph), "--no-check"]) == 0
    earlier, names = graph.read_bytes(), sorted(p.name for p in tmp_path.iterdir())

    def fail(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(onnx_runtime, "compare_with_pytorch", fail)
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(graph), "--postprocess"]) == 2
    assert "checked in ONNX Runtime" not in capsys.readouterr().out
    assert graph.read_bytes() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # no temporary left
    monkeypatch.undo()
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    def runtime_fails(*args, **kwargs):
        raise Fail("no kernel")

    monkeypatch.setattr("onnxruntime.InferenceSession.run", runtime_fails)
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(graph), "--postprocess"]) == 2
    err = capsys.readouterr().err
    assert f"the exported graph (not written to {graph}) failed on a batch of shape" in err and ".tmp-" not in err
    assert graph.read_bytes() == earlier
