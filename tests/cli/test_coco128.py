"""The command line on real COCO images (``../shared/data/coco128``; skipped when absent).

``detr-peg train`` runs in a subprocess for a few iterations of a tiny model
(two data-loader workers, TensorBoard on; the session fixture
``coco128_checkpoint`` of ``tests/conftest.py``) and evaluates on the 28
validation images; ``eval`` and ``predict`` then use the checkpoint it wrote.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml
from PIL import Image

import detr_peg
from detr_peg.cli.main import main
from detr_peg.engine.evaluation.coco_metrics import STAT_NAMES


@pytest.fixture(scope="module")
def trained(coco128_checkpoint: Path) -> Path:
    return coco128_checkpoint.parent


def _category_ids(annotation_file: Path) -> set[int]:
    return {c["id"] for c in json.loads(annotation_file.read_text())["categories"]}


def test_train_writes_config_log_metrics_detections_and_checkpoint(trained: Path, coco128_dir: Path) -> None:
    cfg = yaml.safe_load((trained / "config.yaml").read_text())
    assert cfg["model"]["num_classes"] == 80 and cfg["train"]["max_iters"] == 3

    records = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    kinds = [r["type"] for r in records]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("iter") == 3 and "eval" in kinds
    assert {"loss", "loss_ce", "loss_bbox", "loss_giou", "lr_transformer", "lr_backbone", "grad_norm"} <= set(
        records[1]
    )
    assert list((trained / "tensorboard").glob("events.out.tfevents.*"))

    metrics = json.loads((trained / "metrics.json").read_text())
    assert list(metrics["bbox"]) == list(STAT_NAMES) and metrics["num_images"] == 28
    detections = json.loads((trained / "detections.json").read_text())
    assert detections and {"image_id", "category_id", "bbox", "score"} == set(detections[0])
    assert {d["category_id"] for d in detections} <= _category_ids(coco128_dir / "annotations_val.json")

    model = detr_peg.load_model(trained / "checkpoint.pth")
    assert model.config.model.num_classes == 80 and len(model.label_map.category_ids) == 80
    assert model.label_map.category_ids[-1] == 90  # original COCO ids, not 0..79


def test_eval_writes_metrics_and_detections(trained: Path, coco128_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "eval"
    assert (
        main(["eval", "--checkpoint", str(trained / "checkpoint.pth"), "--output", str(out), "data.num_workers=0"]) == 0
    )
    printed = capsys.readouterr().out
    assert all(name in printed for name in STAT_NAMES)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["bbox"] == pytest.approx(json.loads((trained / "metrics.json").read_text())["bbox"])
    detections = json.loads((out / "detections.json").read_text())
    assert {d["category_id"] for d in detections} <= _category_ids(coco128_dir / "annotations_val.json")
    # per-class AP: its mean over the categories present is the AP; the confusion matrix counts every ground truth
    # and every detection at its threshold once
    rows = list(csv.DictReader((out / "per_class.csv").open()))
    present = [float(r["AP"]) for r in rows if int(r["instances"]) > 0]
    assert detections and present
    assert sum(present) / len(present) == pytest.approx(metrics["bbox"]["AP"], abs=1e-6)
    matrix = json.loads((out / "confusion_matrix.json").read_text())
    annotations = json.loads((coco128_dir / "annotations_val.json").read_text())["annotations"]
    counts, k = matrix["counts"], len(matrix["category_ids"])
    assert sum(sum(row) for row in counts[:k]) == sum(1 for a in annotations if not a.get("iscrowd", 0))
    kept = sum(1 for d in detections if d["score"] >= matrix["score_threshold"])
    assert sum(row[j] for row in counts for j in range(k)) == kept


def test_predict_writes_json_and_pictures(trained: Path, coco128_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    names = sorted(p.name for p in (coco128_dir / "images").iterdir())[:3]
    for name in names[:2]:
        shutil.copy(coco128_dir / "images" / name, folder / name)
    single = coco128_dir / "images" / names[2]
    out = tmp_path / "predictions"
    assert (
        main(
            [
                "predict",
                "--checkpoint",
                str(trained / "checkpoint.pth"),
                str(folder),
                str(single),
                "--output",
                str(out),
                "--score-threshold",
                "0.0",
                "--batch-size",
                "2",
            ]
        )
        == 0
    )
    records = json.loads((out / "predictions.json").read_text())
    categories = {c["id"]: c["name"] for c in json.loads((coco128_dir / "annotations.json").read_text())["categories"]}
    assert {r["image_id"] for r in records} == {1, 2, 3}
    for r in records:
        assert categories[r["category_id"]] == r["category_name"] and 0.0 <= r["score"] <= 1.0
        assert len(r["bbox"]) == 4
    for name in names:
        with Image.open(coco128_dir / "images" / name) as original, Image.open(out / f"{Path(name).stem}.png") as drawn:
            assert drawn.size == original.size and drawn.mode == "RGB"

    # Again into the same folder, on one of the images: the pictures of the others go, the user's file stays.
    (out / "notes.png").write_bytes(b"mine")
    again = ["predict", "--checkpoint", str(trained / "checkpoint.pth"), str(single), "--output", str(out)]
    assert main(again) == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        ["predictions.json", "notes.png", f"{Path(names[2]).stem}.png"]
    )
    assert {r["image_id"] for r in json.loads((out / "predictions.json").read_text())} <= {1}
    assert set(json.loads((out / ".detr-peg-outputs.json").read_text())["names"]) == {
        "predictions.json",
        f"{Path(names[2]).stem}.png",
    }


def test_evaluate_returns_per_class_and_confusion_and_plot_draws_it(trained: Path, tmp_path: Path) -> None:
    detector = detr_peg.Detector.from_checkpoint(trained / "checkpoint.pth", device="cpu")
    written = detector.evaluate(output_dir=tmp_path / "eval", batch_size=4)
    held = detector.evaluate(batch_size=4)  # no files: the same metrics, rows and matrix
    assert dict(held) == pytest.approx(dict(written)) and held.confusion == written.confusion
    assert held.per_class == written.per_class
    rows = list(csv.DictReader((tmp_path / "eval" / "per_class.csv").open()))
    assert [(int(r["category_id"]), float(r["AP"])) for r in rows] == [
        (r["category_id"], pytest.approx(r["AP"])) for r in written.per_class
    ]
    assert json.loads((tmp_path / "eval" / "confusion_matrix.json").read_text()) == written.confusion

    shutil.copy(trained / "metrics.jsonl", tmp_path / "eval" / "metrics.jsonl")  # a run folder's log
    assert main(["plot", str(tmp_path / "eval")]) == 0
    with Image.open(tmp_path / "eval" / "plots" / "confusion_matrix.png") as picture:
        assert picture.format == "PNG" and min(picture.size) > 500
    assert (tmp_path / "eval" / "plots" / "confusion_matrix.pdf").read_bytes()[:5] == b"%PDF-"
    # a matrix that is not square is refused in one sentence, the figures already drawn kept
    matrix = written.confusion | {"counts": written.confusion["counts"][:-1]}
    (tmp_path / "eval" / "confusion_matrix.json").write_text(json.dumps(matrix))
    before = (tmp_path / "eval" / "plots" / "confusion_matrix.png").read_bytes()
    assert main(["plot", str(tmp_path / "eval")]) == 2
    assert (tmp_path / "eval" / "plots" / "confusion_matrix.png").read_bytes() == before


def test_plot_keeps_a_users_figure_in_a_run_copied_without_its_record(trained: Path, tmp_path: Path, capsys) -> None:
    """``cp -r run/* copy/`` leaves the hidden ownership record behind: a figure already in plots/ is the user's."""
    copy = tmp_path / "copy"
    (copy / "plots").mkdir(parents=True)
    for name in ("metrics.jsonl", "config.yaml"):
        shutil.copy(trained / name, copy / name)
    (copy / "plots" / "learning_curve.png").write_bytes(b"mine")
    assert main(["plot", str(copy)]) == 2
    assert "learning_curve.png exists and was not written by detr-peg" in capsys.readouterr().err
    assert (copy / "plots" / "learning_curve.png").read_bytes() == b"mine"
    (copy / "plots" / "learning_curve.png").unlink()
    assert main(["plot", str(copy)]) == 0  # without it the copy is drawn as the run is
    assert (copy / "plots" / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
