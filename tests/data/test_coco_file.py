"""Validation of COCO annotation files: every bad input is a one-sentence DataError."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from detr_peg.data.coco_file import file_name_problem, read_coco_file
from detr_peg.errors import DataError
from tests.data.conftest import assert_one_sentence, base_coco, write_json


def _set(path: list, value: Any) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _append(key: str, entry: dict) -> Callable[[dict], None]:
    return lambda data: data[key].append(entry)


# (id, edit of the valid file, fragments the message must contain)
BAD_FILES = [
    ("images-missing", lambda d: d.pop("images"), ["has no 'images' list"]),
    ("annotations-not-list", _set(["annotations"], {"a": 1}), ["'annotations' of type dict", "must be a list"]),
    ("categories-null", _set(["categories"], None), ["'categories' of type null"]),
    ("image-not-object", _set(["images", 1], "b.png"), ["images[1] of type str"]),
    ("image-id-string", _set(["images", 0, "id"], "1"), ["images[0]", "'id' '1'", "integer id"]),
    ("image-id-missing", lambda d: d["images"][1].pop("id"), ["images[1]", "'id' None"]),
    ("annotation-id-bool", _set(["annotations", 2, "id"], True), ["annotations[2]", "'id' True"]),
    ("duplicate-image-id", _set(["images", 1, "id"], 1), ["duplicate images id 1", "images[1]"]),
    ("duplicate-category-id", _set(["categories", 1, "id"], 7), ["duplicate categories id 7"]),
    ("duplicate-annotation-id", _set(["annotations", 1, "id"], 10), ["duplicate annotations id 10"]),
    ("category-name-missing", lambda d: d["categories"][0].pop("name"), ["category id 7", "'name' None"]),
    ("category-id-negative", _set(["categories", 1, "id"], -1), ["category id -1", "non-negative"]),
    ("image-width-zero", _set(["images", 0, "width"], 0), ["image id 1", "'width' 0"]),
    ("image-height-string", _set(["images", 1, "height"], "24"), ["image id 2", "'height' '24'"]),
    ("no-images", _set(["images"], []), ["empty 'images' list"]),
    ("no-categories", _set(["categories"], []), ["empty 'categories' list"]),
    ("unknown-image-id", _set(["annotations", 0, "image_id"], 99), ["annotation id 10", "image_id 99"]),
    ("unknown-category-id", _set(["annotations", 1, "category_id"], 5), ["annotation id 11", "category_id 5"]),
    ("bbox-length-3", _set(["annotations", 0, "bbox"], [1, 2, 3]), ["annotation id 10", "[1, 2, 3] of length 3"]),
    ("bbox-missing", lambda d: d["annotations"][1].pop("bbox"), ["annotation id 11", "bbox None"]),
    ("bbox-string", _set(["annotations", 0, "bbox", 2], "10"), ["annotation id 10", "not a number"]),
    ("bbox-negative-width", _set(["annotations", 1, "bbox", 2], -2.5), ["annotation id 11", "width is -2.5"]),
    ("bbox-zero-height", _set(["annotations", 0, "bbox", 3], 0), ["annotation id 10", "height is 0"]),
    ("bbox-nan-width", _set(["annotations", 0, "bbox", 2], math.nan), ["annotation id 10", "width is nan"]),
    ("bbox-inf-height", _set(["annotations", 1, "bbox", 3], math.inf), ["annotation id 11", "height is inf"]),
    ("bbox-nan-x", _set(["annotations", 1, "bbox", 0], math.nan), ["annotation id 11", "x or y is not finite"]),
    ("iscrowd-2", _set(["annotations", 0, "iscrowd"], 2), ["annotation id 10", "iscrowd 2"]),
    ("area-negative", _set(["annotations", 1, "area"], -3), ["annotation id 11", "area -3"]),
    ("area-string", _set(["annotations", 0, "area"], "big"), ["annotation id 10", "area 'big'"]),
    ("file-name-absolute", _set(["images", 0, "file_name"], "/etc/a.png"), ["image id 1", "'/etc/a.png'", "absolute"]),
    ("file-name-windows", _set(["images", 0, "file_name"], "C:\\x\\a.png"), ["image id 1", "absolute"]),
    ("file-name-parent", _set(["images", 1, "file_name"], "../b.png"), ["image id 2", "'../b.png'", "leaves"]),
    ("file-name-nested-parent", _set(["images", 1, "file_name"], "sub/../../b.png"), ["image id 2", "leaves"]),
    ("file-name-empty", _set(["images", 0, "file_name"], ""), ["image id 1", "not a non-empty string"]),
    ("file-name-missing", lambda d: d["images"][0].pop("file_name"), ["image id 1", "file_name None"]),
    # One picture listed twice would count as two images with different annotations.
    (
        "file-name-twice",
        lambda d: d["images"][1].update(file_name=d["images"][0]["file_name"]),
        ["lists file_name", "twice (image ids 1 and 2)"],
    ),
    ("file-name-twice-spelled-otherwise", _set(["images", 1, "file_name"], "./a.png"), ["'./a.png' twice"]),
    (
        "file-name-twice-same-size",
        lambda d: d["images"][1].update({k: d["images"][0][k] for k in ("file_name", "width", "height")}),
        ["twice (image ids 1 and 2)"],
    ),
]


@pytest.mark.parametrize("edit, fragments", [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_bad_annotation_file_raises_one_sentence(tmp_path: Path, edit, fragments) -> None:
    data = base_coco()
    edit(data)
    path = write_json(tmp_path / "ann.json", data)
    with pytest.raises(DataError) as info:
        read_coco_file(path)
    assert_one_sentence(str(info.value), str(path), *fragments)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(DataError) as info:
        read_coco_file(path)
    assert_one_sentence(str(info.value), str(path), "does not exist")


def test_folder_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        read_coco_file(tmp_path)
    assert_one_sentence(str(info.value), str(tmp_path), "is a folder")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root can read any file")
def test_unreadable_file(tmp_path: Path) -> None:
    path = write_json(tmp_path / "ann.json", base_coco())
    path.chmod(0)
    try:
        with pytest.raises(DataError) as info:
            read_coco_file(path)
    finally:
        path.chmod(0o644)
    assert_one_sentence(str(info.value), str(path), "cannot be read")


@pytest.mark.parametrize(
    "text, fragments",
    [
        ('{"images": [', ["not valid JSON", "line 1 column"]),
        ("", ["not valid JSON"]),
        ("{'images': []}", ["not valid JSON", "property name"]),
    ],
    ids=["cut", "empty", "single-quotes"],
)
def test_invalid_json(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = tmp_path / "ann.json"
    path.write_text(text)
    with pytest.raises(DataError) as info:
        read_coco_file(path)
    assert_one_sentence(str(info.value), str(path), *fragments)


def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    """Windows editors start UTF-8 files with a BOM; the file reads as the same file without it."""
    plain, marked = tmp_path / "plain.json", tmp_path / "marked.json"
    write_json(plain, base_coco())
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert read_coco_file(marked).data == read_coco_file(plain).data


@pytest.mark.parametrize(
    "raw",
    [b'{"images": "\xff\xfe"}', '{"images": []}'.encode("utf-16"), '{"images": []}'.encode("utf-32")],
    ids=["latin-1 bytes", "UTF-16 with its byte-order mark", "UTF-32"],
)
def test_not_utf8(tmp_path: Path, raw: bytes) -> None:
    """JSON files are UTF-8 (RFC 8259); json.loads of bytes would also have taken UTF-16 and UTF-32."""
    path = tmp_path / "ann.json"
    path.write_bytes(raw)
    with pytest.raises(DataError) as info:
        read_coco_file(path)
    assert_one_sentence(str(info.value), str(path), "not UTF-8")


def test_top_level_list(tmp_path: Path) -> None:
    path = write_json(tmp_path / "ann.json", [base_coco()])
    with pytest.raises(DataError) as info:
        read_coco_file(path)
    assert_one_sentence(str(info.value), str(path), "JSON list at the top level")


def test_error_counts_further_problems(tmp_path: Path) -> None:
    data = base_coco()
    data["annotations"][0]["bbox"][2] = -1
    data["annotations"][1]["category_id"] = 99
    path = write_json(tmp_path / "ann.json", data)
    with pytest.raises(DataError) as info:
        read_coco_file(path)
    assert_one_sentence(str(info.value), "annotation id 10", "1 more problems", "on_bad_sample=skip")


def test_valid_file_is_indexed_silently(tmp_path: Path, capsys) -> None:
    path = write_json(tmp_path / "ann.json", base_coco())
    coco_file = read_coco_file(path)
    assert capsys.readouterr().out == ""
    assert coco_file.problems == []
    assert sorted(coco_file.coco.imgs) == [1, 2]
    assert sorted(coco_file.coco.anns) == [10, 11, 12]
    assert sorted(coco_file.coco.cats) == [3, 7]
    assert [a["id"] for a in coco_file.coco.imgToAnns[1]] == [10, 11]


def test_skip_leaves_out_bad_images_and_orphan_annotations(tmp_path: Path, caplog) -> None:
    data = base_coco()
    data["images"].append({"id": 3, "file_name": "c.png", "width": 8, "height": 8})
    data["annotations"] += [
        {"id": 13, "image_id": 3, "category_id": 3, "bbox": [1, 1, 2, 2], "iscrowd": 0},
        {"id": 14, "image_id": 42, "category_id": 3, "bbox": [1, 1, 2, 2], "iscrowd": 0},
    ]
    data["annotations"][0]["bbox"][3] = -4  # image 1 becomes invalid, with both its annotations
    data["images"][1]["file_name"] = "../escape.png"  # image 2 becomes invalid
    path = write_json(tmp_path / "ann.json", data)
    with caplog.at_level(logging.WARNING):
        coco_file = read_coco_file(path, on_bad_sample="skip")
    assert len(coco_file.problems) == 3
    assert sorted(coco_file.coco.imgs) == [3]
    assert sorted(coco_file.coco.anns) == [13]
    assert [img["id"] for img in coco_file.data["images"]] == [3]
    messages = [r.getMessage() for r in caplog.records]
    assert any("annotation id 10" in m and "height is -4" in m for m in messages)
    assert any("annotation id 14" in m and "image_id 42" in m for m in messages)
    assert any("'../escape.png'" in m for m in messages)
    # the file itself is untouched
    assert json.loads(path.read_text()) == data


def test_skip_names_five_problems_and_counts_the_rest(tmp_path: Path, caplog) -> None:
    data = base_coco()
    data["images"] += [{"id": i, "file_name": f"{i}.png", "width": 8, "height": 8} for i in range(100, 400)]
    data["annotations"] += [{"id": i, "image_id": i, "category_id": 3, "bbox": [1, 1, -2, 2], "iscrowd": 0}
                            for i in range(100, 400)]  # fmt: skip
    path = write_json(tmp_path / "ann.json", data)
    with caplog.at_level(logging.WARNING):
        coco_file = read_coco_file(path, on_bad_sample="skip")
    assert len(coco_file.problems) == 300 and sorted(coco_file.coco.imgs) == [1, 2]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 6 and all("annotation id 10" in m for m in messages[:5]), messages
    assert messages[5] == f"Skipping: 295 more problems in {path}; 300 of its 302 images are left out in all."


def test_skip_with_nothing_left(tmp_path: Path) -> None:
    data = base_coco()
    for img in data["images"]:
        img["file_name"] = "/abs/" + img["file_name"]
    path = write_json(tmp_path / "ann.json", data)
    with pytest.raises(DataError) as info:
        read_coco_file(path, on_bad_sample="skip")
    assert_one_sentence(str(info.value), str(path), "no valid image left")


@pytest.mark.parametrize("name", ["a.jpg", "sub/dir/a.jpg", "./a.jpg", "sub/../a.jpg", "a..b.jpg", "..a.jpg"])
def test_acceptable_file_names(name: str) -> None:
    assert file_name_problem(name) is None


def test_coco128_files_are_valid(coco128_dir: Path) -> None:
    for name in ("annotations.json", "annotations_train.json", "annotations_val.json"):
        coco_file = read_coco_file(coco128_dir / name)
        assert coco_file.problems == []
        assert len(coco_file.coco.anns) == len(coco_file.data["annotations"])


def test_missing_area_becomes_the_box_area(tmp_path: Path) -> None:
    data = base_coco()
    del data["annotations"][1]["area"]
    coco = read_coco_file(write_json(tmp_path / "ann.json", data)).coco
    assert coco.anns[11]["area"] == 300.0
    assert coco.anns[10]["area"] == 200.0


def test_category_names_that_do_not_tell_categories_apart_are_warned_of(tmp_path: Path, caplog) -> None:
    data = base_coco()
    data["categories"] += [{"id": 9, "name": data["categories"][0]["name"]}, {"id": 10, "name": " "}]
    path = write_json(tmp_path / "ann.json", data)
    with caplog.at_level(logging.WARNING):
        read_coco_file(path)
    shared = data["categories"][0]["name"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{path}: category names ' ', {shared!r} are empty or shared by several ids; the outputs tell those "
        "categories apart only by category_id."
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        read_coco_file(write_json(tmp_path / "fine.json", base_coco()))
    assert not caplog.records


@pytest.mark.parametrize("key", ["neg_category_ids", "not_exhaustive_category_ids"])
def test_an_lvis_file_is_read_as_coco_with_a_warning_that_says_what_that_means(tmp_path: Path, caplog, key) -> None:
    data = base_coco()
    data["images"][0][key] = [data["categories"][0]["id"]]
    path = write_json(tmp_path / "lvis.json", data)
    with caplog.at_level(logging.WARNING):
        assert len(read_coco_file(path).coco.anns) == len(data["annotations"])
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{path} is an LVIS file: detr_peg reads it as COCO, so objects of the categories not checked in an image are "
        "trained as background and its detections count as false positives; the AP is COCO's, not LVIS's (the lvis "
        "package computes that)."
    ]
