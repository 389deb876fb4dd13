"""Models converted from the official fixtures' weights (shared/reference), exported to ONNX and run in ONNX
Runtime, reproduce the official outputs at the parity tolerance (rtol 1e-4, atol 1e-5).

Both detectors are exported at the fixture's batch and size: what is checked here is the official weights
through the exported graph. With symbolic sizes an export costs two (DETR) to four (Deformable-DETR) times as
much, and the dynamic graphs (levels, masks, positional encodings, deformable attention) are checked against
PyTorch on other sizes and padded batches by ``test_onnx_export``, whose PyTorch models match the official ones
(``tests/models``). Deformable-DETR with box refinement and two-stage is left out here: its PyTorch outputs match
the official ones (``tests/models/deformable``) and its exported graph matches PyTorch (``test_onnx_export``)."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from detr_peg import load_model
from detr_peg.cli.main import main
from detr_peg.export.onnx_export import export_onnx
from detr_peg.export.onnx_runtime import OnnxDetector
from tests.parity import assert_close, load_fixture, write_official_checkpoint

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("fixture", ["detr_r18", "deformable_detr_r18"])
def test_exported_official_weights_match_official_outputs(fixture, tmp_path, reference_dir):
    src, dst = tmp_path / "official.pth", tmp_path / "converted.pth"
    write_official_checkpoint(reference_dir, fixture, src)
    assert main(["convert", str(src), str(dst)]) == 0
    inputs = load_fixture(reference_dir, fixture, "inputs")
    batch, _, height, width = inputs["images_padded"].shape
    assert inputs["mask"].any()  # a padded batch
    fixed = {"image_size": (height, width), "batch_size": batch}
    detector = OnnxDetector(export_onnx(load_model(dst), tmp_path / "model.onnx", optimize=False, **fixed))
    got = detector(inputs["images_padded"], inputs["mask"])
    expected = load_fixture(reference_dir, fixture, "outputs")
    for name in ("pred_logits", "pred_boxes"):
        assert_close(got[name], expected[name], name)
