"""``detr-peg demo`` end to end with a tiny model and a handful of images.

The command runs in a subprocess exactly as a user starts it (only the size
of the model, the data and the budget are overridden); a second run in the
same folder reuses the dataset and replaces the finished run.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from PIL import Image
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

import detr_peg
from detr_peg.cli.demo import clear_folder, default_config, format_elapsed, is_run_file
from detr_peg.cli.main import main
from detr_peg.engine.evaluation.coco_metrics import STAT_NAMES
from detr_peg.errors import UserError
from tests.conftest import REPO_ROOT, TINY_DEMO, without_option


@pytest.fixture(scope="module")
def demo_dir(tiny_demo_dir: Path) -> Path:
    return tiny_demo_dir


def test_demo_writes_dataset_run_metrics_and_pictures(demo_dir: Path) -> None:
    stdout = (demo_dir / "stdout.txt").read_text()
    summary = stdout.strip().splitlines()[-1]
    assert summary.startswith("demo: AP50 ") and "on 4 synthetic validation images after 2 iterations" in summary
    assert str(demo_dir / "predictions") in summary
    assert "AP50" in stdout and "COCO bbox evaluation (4 images)" in stdout

    val = json.loads((demo_dir / "data" / "annotations_val.json").read_text())
    assert len(val["images"]) == 4 and val["annotations"]
    assert len(json.loads((demo_dir / "data" / "annotations_train.json").read_text())["images"]) == 8

    # metrics.json is COCOeval of the run's detections.json, and the summary line prints it.
    metrics = json.loads((demo_dir / "run" / "metrics.json").read_text())
    assert metrics["num_images"] == 4
    detections = json.loads((demo_dir / "run" / "detections.json").read_text())
    assert len(detections) == metrics["num_detections"] > 0
    recomputed = coco_metrics(demo_dir / "data" / "annotations_val.json", detections)
    # COCOeval's fractions, in percent: the unit of every metric detr_peg writes and prints.
    assert metrics["unit"] == "percent"
    assert metrics["bbox"] == pytest.approx({k: v if v < 0 else 100 * v for k, v in recomputed.items()}, abs=1e-9)
    bbox = metrics["bbox"]
    assert summary.startswith(f"demo: AP50 {bbox['AP50']:.1f} % (AP {bbox['AP']:.1f} %) on 4 ")

    model = detr_peg.load_model(demo_dir / "run" / "checkpoint.pth")
    assert model.config.model.arch == "deformable_detr" and model.config.model.position.name == "peg"
    assert model.config.model.backbone.norm == "bn" and model.config.train.max_iters == 2

    pictures = sorted((demo_dir / "predictions").glob("*.png"))
    assert [p.name for p in pictures] == ["000000.png", "000001.png", "000002.png"]
    with Image.open(pictures[0]) as picture:
        assert picture.size == (384, 384)  # 128-pixel images drawn three times larger

    # predictions.json holds exactly what the checkpoint predicts on the first three validation images.
    records = json.loads((demo_dir / "predictions" / "predictions.json").read_text())
    images = sorted((demo_dir / "data" / "val").glob("*.png"))[:3]
    detector = detr_peg.Detector.from_checkpoint(demo_dir / "run" / "checkpoint.pth", device="cpu")
    expected = [r for i, image in enumerate(images) for r in detector.predict(image, threshold=0.0).records(i + 1)]
    assert records == expected and {r["image_id"] for r in records} == {1, 2, 3}
    assert {r["file_name"] for r in records} == {str(p) for p in images}
    assert f"{len(records)} detections (score >= 0) drawn on 3 pictures" in stdout


def coco_metrics(annotation_file: Path, detections: list[dict]) -> dict[str, float]:
    """COCOeval bbox metrics of ``detections`` against ``annotation_file``, by the names of STAT_NAMES."""
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(annotation_file))
        evaluator = COCOeval(gt, gt.loadRes(detections), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return dict(zip(STAT_NAMES, (float(v) for v in evaluator.stats)))


def test_rerun_reuses_the_dataset_and_trains_afresh(demo_dir: Path, capsys) -> None:
    manifest = demo_dir / "data" / "manifest.json"
    stamp = manifest.stat().st_mtime_ns
    (demo_dir / "predictions" / "stale.png").write_bytes(b"")
    assert main(["demo", "--output", str(demo_dir), *without_option(TINY_DEMO, "--pictures"), "--pictures", "1"]) == 0
    assert manifest.stat().st_mtime_ns == stamp
    starts = [json.loads(line) for line in (demo_dir / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["resumed_iteration"] for r in starts if r["type"] == "start"] == [0]  # a new log, not appended
    assert [p.name for p in (demo_dir / "predictions").glob("*.png")] == ["000000.png"]
    assert "after 2 iterations" in capsys.readouterr().out


def test_run_folder_with_foreign_files_is_not_cleared(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.pth").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="notes.txt"):
        clear_folder(tmp_path, is_run_file)
    assert (tmp_path / "checkpoint.pth").exists()


def test_default_config_is_the_repository_demo_config() -> None:
    assert default_config() == REPO_ROOT / "configs" / "demo.yaml"
    assert (format_elapsed(460), format_elapsed(12)) == ("7 min 40 s", "12 s")


def test_data_only_generates_the_dataset_of_the_demo_and_trains_nothing(demo_dir: Path, tmp_path: Path, capsys) -> None:
    """``--data-only`` writes the same dataset as a full demo with the same parameters, and no run."""
    out = tmp_path / "demo"
    assert main(["demo", "--output", str(out), "--data-only", "--num-train", "8", "--num-val", "4"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"demo: dataset {out / 'data'} (")
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["data"]  # no run, no pictures
    for name in ("annotations_train.json", "annotations_val.json"):
        assert json.loads((out / "data" / name).read_text()) == json.loads((demo_dir / "data" / name).read_text())
    for split in ("train", "val"):
        ours = sorted((out / "data" / split).iterdir())
        assert [p.name for p in ours] == sorted(p.name for p in (demo_dir / "data" / split).iterdir())
        assert all(p.read_bytes() == (demo_dir / "data" / split / p.name).read_bytes() for p in ours)
