"""YOLO-format datasets: a YOLO export of coco128, made here, reads as the COCO file does, trains and evaluates."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from detr_peg.data import CocoDetection
from detr_peg.errors import DataError
from tests.conftest import CLI, COCO128_SMALL, run_python
from tests.data.conftest import assert_one_sentence
from tests.engine.tiny_run import RUN, TINY_MODEL, data_overrides


def export_yolo(coco128_dir: Path, root: Path) -> Path:
    """Write coco128 in Ultralytics' layout under ``root`` (class i = the i-th COCO id); returns its data.yaml.

    Crowd regions are left out (YOLO has none), and images without objects get no label file.
    """
    for split in ("train", "val"):
        data = json.loads((coco128_dir / f"annotations_{split}.json").read_text())
        class_of = {c["id"]: i for i, c in enumerate(sorted(data["categories"], key=lambda c: c["id"]))}
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        lines: dict[int, list[str]] = {}
        sizes = {img["id"]: (img["width"], img["height"]) for img in data["images"]}
        for ann in data["annotations"]:
            if not ann["iscrowd"]:
                (w, h), (x, y, bw, bh) = sizes[ann["image_id"]], ann["bbox"]
                box = ((x + bw / 2) / w, (y + bh / 2) / h, bw / w, bh / h)
                lines.setdefault(ann["image_id"], []).append(
                    f"{class_of[ann['category_id']]} " + " ".join(f"{v:.8f}" for v in box)
                )
        for img in data["images"]:
            shutil.copy(coco128_dir / "images" / img["file_name"], root / "images" / split / img["file_name"])
            if img["id"] in lines:
                (root / "labels" / split / img["file_name"]).with_suffix(".txt").write_text(
                    "\n".join(lines[img["id"]]) + "\n"
                )
    names = [c["name"] for c in sorted(data["categories"], key=lambda c: c["id"])]
    (root / "data.yaml").write_text(
        json.dumps({"path": ".", "train": "images/train", "val": "images/val", "names": names})
    )
    return root / "data.yaml"


@pytest.fixture(scope="module")
def yolo(coco128_dir: Path, tmp_path_factory) -> Path:
    return export_yolo(coco128_dir, tmp_path_factory.mktemp("yolo"))


@pytest.mark.parametrize("split", ["train", "val"])
def test_yolo_export_reads_as_the_coco_file(yolo: Path, coco128_dir: Path, split: str) -> None:
    from_coco = CocoDetection(
        images_dir=coco128_dir / "images", annotation_file=coco128_dir / f"annotations_{split}.json"
    )
    from_yolo = CocoDetection(images_dir=yolo.parent / "images" / split, annotation_file=yolo)
    assert len(from_yolo) == len(from_coco) and from_yolo.label_map.names == from_coco.label_map.names
    for index in range(len(from_coco)):
        coco_image, coco_target = from_coco[index]
        yolo_image, yolo_target = from_yolo[index]
        assert from_yolo.image_path(index).name == from_coco.image_path(index).name
        torch.testing.assert_close(yolo_image, coco_image, rtol=0, atol=0)
        torch.testing.assert_close(yolo_target["labels"], coco_target["labels"])
        # 8 decimals of the normalised box: within 1e-5 px on a 640 px image
        torch.testing.assert_close(yolo_target["boxes"], coco_target["boxes"], rtol=0, atol=1e-3, check_stride=False)


def test_train_on_a_yolo_copy_of_coco128_runs_and_evaluates(yolo: Path, tmp_path: Path) -> None:
    images = yolo.parent / "images"
    proc = run_python(
        *CLI, "train", "--output", str(tmp_path / "run"), *TINY_MODEL, *COCO128_SMALL, *RUN,
        "train.batch_size=2", "train.max_iters=2", "data.num_workers=0",
        *data_overrides(images / "train", yolo, images / "val", yolo),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["num_images"] == 28 and set(metrics["bbox"]) >= {"AP", "AP50"}
    rows = list(csv.DictReader((tmp_path / "run" / "per_class.csv").open()))
    assert [r["name"] for r in rows][:3] == ["person", "bicycle", "car"] and len(rows) == 80


def _dataset(tmp_path: Path, label: str, yaml_text: str = "names: [cat, dog]\n", folder: str = "images") -> Path:
    """One 32 x 24 picture under ``tmp_path/<folder>`` with ``label`` as its label file; returns the data.yaml."""
    from PIL import Image

    (tmp_path / folder).mkdir(parents=True)
    Image.new("RGB", (32, 24)).save(tmp_path / folder / "a.png")
    if folder == "images":
        (tmp_path / "labels").mkdir()
        (tmp_path / "labels" / "a.txt").write_text(label)
    (tmp_path / "data.yaml").write_text(yaml_text)
    return tmp_path / "data.yaml"


def test_digit_class_names_are_read_as_text(tmp_path: Path) -> None:
    """``names: [0, 1]`` (a digit dataset) names its classes "0" and "1", as Ultralytics reads it."""
    data_yaml = _dataset(tmp_path, "1 0.5 0.5 0.2 0.2\n", "names: [0, 1]\n", "images")
    dataset = CocoDetection(images_dir=tmp_path / "images", annotation_file=data_yaml)
    assert [c["name"] for c in dataset.coco.loadCats(dataset.coco.getCatIds())] == ["0", "1"]


@pytest.mark.parametrize(
    ("label", "yaml_text", "folder", "fragments"),
    [
        ("2 0.5 0.5 0.2 0.2\n", None, "images", ["a.txt has, on line 1, a box with category_id 2"]),
        ("cat 0.5 0.5 0.2 0.2\n", None, "images", ["category_id 'cat'"]),
        ("0 0.5 0.5\n", None, "images", ["a.txt has, on line 1", "not a list of 4 numbers"]),
        ("\n0 0.5 0.5 0.2 nan\n", None, "images", ["on line 2", "nan] whose x or y is not finite"]),
        ("0 0.5 0.5 -0.2 0.2\n", None, "images", ["coordinates 0.5 0.5 -0.2 0.2, but YOLO coordinates are"]),
        ("0 0.5 0.5 3 3\n", None, "images", ["a.txt has, on line 1, a box with coordinates 0.5 0.5 3 3, but YOLO"]),
        ("0 320 200 100 80\n", None, "images", ["coordinates 320 200 100 80, but YOLO coordinates are fractions"]),
        ("0 0.5 0.5 0.2 0.2 0.9\n", None, "images", ["of length 5"]),
        ("0 0.5 0.5 0.2 0.2\n", "nc: 2\n", "images", ["data.yaml has 'names' None"]),
        ("0 0.5 0.5 0.2 0.2\n", "names: {a: cat}\n", "images", ["'names' {'a': 'cat'}"]),
        ("0 0.5 0.5 0.2 0.2\n", "names: []\n", "images", ["data.yaml has 'names' []"]),
        (
            "0 0.5 0.5 0.2 0.2\n",
            "names: [cat\n",
            "images",
            ["data.yaml: invalid YAML at line 2, column 1 (expected ',' or ']'"],
        ),
        ("0 0.5 0.5 0.2 0.2\n", "names: [cat, null]\n", "images", ["'name' None; names must be strings"]),
        ("0 0.5 0.5 0.2 0.2\n", None, "pictures", ["is not under a folder named 'images'"]),
        ("9" * 5000 + " 0.5 0.5 0.2 0.2\n", None, "images", ["category_id '99999"]),
        ("\u00b2 0.5 0.5 0.2 0.2\n", None, "images", ["category_id '\u00b2'"]),
        ("\u0661 0.5 0.5 0.2 0.2\n", None, "images", ["category_id '\u0661'"]),
    ],
)
def test_bad_yolo_input_is_one_sentence(tmp_path: Path, label: str, yaml_text, folder: str, fragments: list) -> None:
    data_yaml = _dataset(tmp_path, label, yaml_text or "names: [cat, dog]\n", folder)
    with pytest.raises(DataError) as err:
        CocoDetection(images_dir=tmp_path / folder, annotation_file=data_yaml)
    assert_one_sentence(str(err.value), *fragments)


def test_a_data_yaml_needs_its_image_folder(tmp_path: Path) -> None:
    from detr_peg.data import read_coco_file

    with pytest.raises(DataError) as err:
        read_coco_file(_dataset(tmp_path, "0 0.5 0.5 0.2 0.2\n"))
    assert_one_sentence(str(err.value), "is a YOLO data.yaml; give the image folder")


def test_a_polygon_line_gives_its_box(tmp_path: Path) -> None:
    data_yaml = _dataset(tmp_path, "1 0.25 0.5 0.75 0.25 0.5 1.0\n")
    _, target = CocoDetection(images_dir=tmp_path / "images", annotation_file=data_yaml)[0]
    torch.testing.assert_close(target["boxes"].as_subclass(torch.Tensor), torch.tensor([[8.0, 6.0, 24.0, 24.0]]))
    assert target["labels"].tolist() == [1]


def test_an_image_with_a_bad_line_is_skipped_on_request(tmp_path: Path) -> None:
    from PIL import Image

    data_yaml = _dataset(tmp_path, "0 0.5 0.5 0.2 0.2 0.9\n")
    Image.new("RGB", (32, 24)).save(tmp_path / "images" / "b.png")  # no label file: no objects
    dataset = CocoDetection(images_dir=tmp_path / "images", annotation_file=data_yaml, on_bad_sample="skip")
    assert dataset.num_invalid_skipped == 1 and [dataset.image_path(i).name for i in range(len(dataset))] == ["b.png"]
    assert dataset[0][1]["labels"].numel() == 0


def test_bad_yolo_data_exits_2_with_one_line(tmp_path: Path) -> None:
    data_yaml = _dataset(tmp_path, "7 0.5 0.5 0.2 0.2\n")
    images = str(tmp_path / "images")
    proc = run_python(*CLI, "train", "--output", str(tmp_path / "run"), *TINY_MODEL, *RUN,
                      *data_overrides(images, data_yaml, images, data_yaml))  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert_one_sentence(lines[0].removeprefix("detr-peg train: error: "), "a.txt has, on line 1", "category_id 7")
    assert not (tmp_path / "run" / "checkpoint.pth").exists()


def test_yolo_files_that_are_not_what_they_seem(tmp_path: Path) -> None:
    from PIL import Image

    data_yaml = _dataset(tmp_path, "\ufeff1 0.5 0.5 0.5 0.5\n")  # a byte-order mark is not part of the class
    assert CocoDetection(images_dir=tmp_path / "images", annotation_file=data_yaml)[0][1]["labels"].tolist() == [1]
    Image.new("RGB", (32, 24)).save(tmp_path / "images" / "a.jpg")  # a.png and a.jpg would share labels/a.txt
    with pytest.raises(DataError) as err:
        CocoDetection(images_dir=tmp_path / "images", annotation_file=data_yaml)
    assert_one_sentence(str(err.value), "a.jpg and", "a.png share the label file", "rename one of them")
    (tmp_path / "images" / "a.jpg").unlink()
    (tmp_path / "labels" / "a.txt").unlink()
    (tmp_path / "labels" / "a.txt").symlink_to(tmp_path / "missing.txt")  # a dangling link is not "no objects"
    with pytest.raises(DataError) as err:
        CocoDetection(images_dir=tmp_path / "images", annotation_file=data_yaml)
    assert_one_sentence(str(err.value), "a.txt")
    (tmp_path / "labels" / "a.txt").unlink()  # no label file at all: not a dataset without objects
    with pytest.raises(DataError) as err:
        CocoDetection(images_dir=tmp_path / "images", annotation_file=data_yaml)
    assert_one_sentence(str(err.value), "None of the 1 images under", "has a label file", "labels/a.txt")


def test_an_image_whose_header_is_too_large_is_named_when_loaded(tmp_path: Path, monkeypatch) -> None:
    from PIL import Image

    data_yaml = _dataset(tmp_path, "0 0.5 0.5 0.5 0.5\n")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 32 x 24 is now more than twice the limit: a "bomb"
    dataset = CocoDetection(images_dir=tmp_path / "images", annotation_file=data_yaml)
    with pytest.raises(DataError) as err:
        dataset[0]
    assert "a.png is too large to decode safely" in str(err.value)
