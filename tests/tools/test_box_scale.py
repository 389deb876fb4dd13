"""tools/box_scale.py: the size of a model's boxes against the true ones per test size, run as a script on a demo."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch
from torchvision.ops import box_iou

from detr_peg.detector import Detector
from tests.conftest import run_python
from tests.tools.tool_module import load_tool, run_main

TOOL = "tools/box_scale.py"


def _expected(checkpoint: Path, data: Path, short: int, long: int, count: int) -> dict:
    """The tool's numbers for one test size, computed here from the annotation file and Detector.predict."""
    coco = json.loads((data / "annotations_val.json").read_text())
    images = coco["images"][:count]
    detector = Detector.from_checkpoint(
        checkpoint, device="cpu", overrides=[f"data.val_scale={short}", f"data.val_max_size={long}"]
    )
    found = detector.predict([data / "val" / image["file_name"] for image in images], threshold=0.0)
    widths, heights, detections = [], [], 0
    for image, result in zip(images, found):
        truth = torch.tensor(
            [
                [x, y, x + w, y + h]
                for a in coco["annotations"]
                if a["image_id"] == image["id"]
                for x, y, w, h in [a["bbox"]]
            ],
            dtype=torch.float32,
        ).reshape(-1, 4)
        boxes = torch.as_tensor(result.boxes, dtype=torch.float32).reshape(-1, 4)
        detections += len(boxes)
        if len(truth) and len(boxes):
            iou = box_iou(boxes, truth)
            for k in range(len(boxes)):
                j = int(iou[k].argmax())
                widths.append(float((boxes[k, 2] - boxes[k, 0]) / (truth[j, 2] - truth[j, 0])))
                heights.append(float((boxes[k, 3] - boxes[k, 1]) / (truth[j, 3] - truth[j, 1])))
    return {
        "matched": len(widths),
        "detections": detections,
        "width_ratio": statistics.median(widths),
        "height_ratio": statistics.median(heights),
    }


def test_the_tool_reports_the_median_box_size_ratio_per_test_size(tiny_demo_dir: Path, tmp_path: Path) -> None:
    checkpoint, data = tiny_demo_dir / "run" / "checkpoint.pth", tiny_demo_dir / "data"
    out = tmp_path / "box_scale.json"
    proc = run_python(
        TOOL, "--checkpoint", str(checkpoint), "--annotations", str(data / "annotations_val.json"),
        "--images", str(data / "val"), "--scales", "1,1.5", "--count", "3", "--threshold", "0", "--min-iou", "0",
        "--output", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report == json.loads(out.read_text())
    assert (report["images"], report["threshold"], report["min_iou"]) == (3, 0.0, 0.0)
    assert (report["checkpoint"], report["annotations"]) == (str(checkpoint), str(data / "annotations_val.json"))
    config = Detector.from_checkpoint(checkpoint, device="cpu").config.data
    for row, scale in zip(report["results"], (1.0, 1.5), strict=True):
        short, long = round(config.val_scale * scale), round(config.val_max_size * scale)
        assert (row["scale"], row["short_side"]) == (scale, short)
        expected = _expected(checkpoint, data, short, long, 3)
        assert row["matched"] == expected["matched"] == row["detections"] > 0  # every box matched at IoU >= 0
        torch.testing.assert_close(row["width_ratio"], expected["width_ratio"])
        torch.testing.assert_close(row["height_ratio"], expected["height_ratio"])


def test_each_scale_is_detected_at_its_own_size(tiny_demo_dir: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    # A 2-iteration model predicts nearly the same normalised boxes at any size, so the ratios cannot show that
    # each scale was run at its size: the detectors the tool measures with are recorded instead.
    tool = load_tool(TOOL)
    used: list[tuple[int, int | None]] = []
    original = tool.box_scale

    def recording(detector, samples, **kwargs):
        used.append((detector.config.data.val_scale, detector.config.data.val_max_size))
        return original(detector, samples, **kwargs)

    monkeypatch.setattr(tool, "box_scale", recording)
    checkpoint, data = tiny_demo_dir / "run" / "checkpoint.pth", tiny_demo_dir / "data"
    argv = ["--checkpoint", str(checkpoint), "--annotations", str(data / "annotations_val.json")]
    assert tool.main([*argv, "--images", str(data / "val"), "--count", "1", "--scales", "0.5,1,2"]) == 0
    base = Detector.from_checkpoint(checkpoint, device="cpu").config.data
    assert used == [(round(base.val_scale * s), round(base.val_max_size * s)) for s in (0.5, 1.0, 2.0)]
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [r["short_side"] for r in rows] == [round(base.val_scale * s) for s in (0.5, 1.0, 2.0)]


def test_a_match_needs_the_minimum_overlap(tiny_demo_dir: Path) -> None:
    checkpoint, data = tiny_demo_dir / "run" / "checkpoint.pth", tiny_demo_dir / "data"
    args = [TOOL, "--checkpoint", str(checkpoint), "--annotations", str(data / "annotations_val.json")]
    proc = run_python(*args, "--images", str(data / "val"), "--count", "3", "--threshold", "0", "--min-iou", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["results"]
    # No detection of a 2-iteration model covers a true box exactly.
    assert row["matched"] == 0 and row["detections"] > 0 and row["width_ratio"] is None


def test_bad_input_is_one_line_and_exit_2(tiny_demo_dir: Path, tmp_path: Path, capsys) -> None:
    checkpoint, data = tiny_demo_dir / "run" / "checkpoint.pth", tiny_demo_dir / "data"
    base = [TOOL, "--checkpoint", str(checkpoint), "--images", str(data / "val")]
    # As a script, in a process of its own: one line, exit 2, no traceback.
    proc = run_python(*base, "--annotations", str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert str(tmp_path / "missing.json") in proc.stderr and "Traceback" not in proc.stderr
    # The other inputs through main() in this process (the same code after the start-up).
    tool, args = load_tool(TOOL), base[1:]
    for option, value in (("--scales", "0"), ("--scales", "1,1"), ("--count", "0"), ("--min-iou", "2")):
        result = run_main(tool, capsys, *args, "--annotations", str(data / "annotations_val.json"), option, value)
        assert result.returncode == 2 and result.stderr.startswith(f"box_scale.py: error: argument {option}: ")
        assert len(result.stderr.strip().splitlines()) == 1
    # Every scale is checked before anything runs, as detr-peg eval checks them; so is the output's folder.
    for scales, start in (
        ("1,1000", "--scales 1000 gives images of up to "),
        ("1,0.001", "--scales 0.001 makes data.val_"),
    ):
        result = run_main(tool, capsys, *args, "--annotations", str(data / "annotations_val.json"), "--scales", scales)
        assert result.returncode == 2 and result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
        assert result.stderr.startswith(f"box_scale.py: {start}")
    mine = tmp_path / "mine.json"  # the output follows every command's rules: a file of the user's is kept
    mine.write_text("my notes")
    result = run_main(tool, capsys, *args, "--annotations", str(data / "annotations_val.json"), "--output", str(mine))
    assert result.returncode == 2 and result.stdout == "" and mine.read_text() == "my notes"
    assert result.stderr.strip().startswith(f"box_scale.py: {mine} exists and was not written by detr-peg")
    # The annotation file names an image the folder does not hold.
    result = run_main(tool, capsys, "--checkpoint", str(checkpoint), "--annotations", str(data / "annotations_val.json"),
                      "--images", str(tmp_path))  # fmt: skip
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert f"is in the image folder {tmp_path}" in result.stderr
    result = run_main(tool, capsys, "--checkpoint", str(tmp_path / "c.pth"), "--annotations",
                      str(data / "annotations_val.json"), "--images", str(data / "val"))  # fmt: skip
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and "c.pth" in result.stderr


def test_a_yolo_data_yaml_gives_the_boxes_of_its_coco_file(coco128_dir: Path, tmp_path: Path) -> None:
    """--annotations data.yaml with --images of its split reads the YOLO copy: the same images and boxes."""
    from tests.data.test_yolo_file import export_yolo

    data_yaml = export_yolo(coco128_dir, tmp_path / "yolo")
    tool = load_tool(TOOL)
    coco = {path.name: boxes for path, boxes in tool.ground_truth(coco128_dir / "annotations_val.json",
                                                                   coco128_dir / "images", 1000)}  # fmt: skip
    yolo = {
        path.name: boxes for path, boxes in tool.ground_truth(data_yaml, tmp_path / "yolo" / "images" / "val", 1000)
    }
    assert set(yolo) == set(coco)
    for name, boxes in coco.items():
        torch.testing.assert_close(yolo[name], boxes, rtol=0, atol=1e-3)  # 8 decimals of the normalised box
