"""A converted Transformers checkpoint evaluates, predicts and exports with the existing commands.

The small random models of ``transformers_models`` (DETR, and the two-stage
Deformable-DETR, the variant with the most parts) are converted with
``detr-peg convert`` at a small evaluation size, then run through
``detr-peg eval`` on a synthetic COCO set whose category ids (1..4) are
those of the models' ``id2label``, ``detr-peg predict`` and ``detr-peg
export``, which checks the graph in ONNX Runtime against PyTorch. The export
fixes the batch and image size (``--batch-size 1 --image-size 96 128``): a
dynamic graph takes four to five times as long to trace here, and dynamic
exports of both architectures, two-stage included, are tested against
PyTorch in ``tests/export/test_onnx_export.py``.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from detr_peg.cli.main import main
from tests.engine.tiny_run import synthetic_data

SMALL_EVAL = ["data.val_scale=96", "data.val_max_size=128", "eval.batch_size=4", "data.num_workers=0"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synthetic_data(tmp_path_factory.mktemp("data"), num_train=1, num_val=4)


def _converted(folder, tmp_path):
    checkpoint = tmp_path / "converted.pth"
    assert main(["convert", str(folder), str(checkpoint), *SMALL_EVAL]) == 0
    return checkpoint


@pytest.mark.parametrize("case", ["detr", "deformable-two-stage"])
def test_eval_and_predict_take_the_converted_checkpoint(case, transformers_folder, data, tmp_path):
    checkpoint = _converted(transformers_folder(case), tmp_path)
    dataset = [f"data.val_images={data.val_images}", f"data.val_annotations={data.val_annotations}"]
    assert main(["eval", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "eval"), *dataset]) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["num_images"] == 4 and set(metrics["bbox"]) >= {"AP", "AP50", "AR100"}

    image = next(data.val_images.iterdir())
    predict = ["predict", "--checkpoint", str(checkpoint), str(image), "--score-threshold", "0"]
    assert main([*predict, "--output", str(tmp_path / "predictions")]) == 0
    records = json.loads((tmp_path / "predictions" / "predictions.json").read_text())
    assert records and {r["category_name"] for r in records} <= {"class 0", "circle", "square", "triangle", "cross"}


@pytest.mark.slow
@pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("onnx", "onnxscript", "onnxruntime")),
    reason="the optional onnx packages are not installed",
)
@pytest.mark.parametrize("case", ["detr", "deformable-two-stage"])
def test_export_takes_the_converted_checkpoint(case, transformers_folder, tmp_path, capsys):
    checkpoint = _converted(transformers_folder(case), tmp_path)
    capsys.readouterr()
    fixed = ["--batch-size", "1", "--image-size", "96", "128"]
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "model.onnx"), *fixed]) == 0
    out = capsys.readouterr().out
    arch = "detr" if case == "detr" else "deformable_detr"
    assert out.splitlines()[0] == f"exporting {arch} to {tmp_path / 'model.onnx'} ..."  # nothing dynamic
    assert "checked in ONNX Runtime against PyTorch" in out
    # Landscape images resize to 96 x 128 and portrait ones to 128 x 96, which the 96 x 128 graph refuses.
    assert "Note: this config resizes images to 96 px on the short side, up to 128 on the long one; " in out
