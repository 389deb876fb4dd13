"""Bad input through the real command line: one clear line, a non-zero status, earlier outputs untouched.

Each case copies a folder holding a tiny dataset and an earlier successful
run (see ``conftest.py``), breaks one thing, runs one ``detr-peg`` command in
its own process and checks:

* exit status 2 (a user error);
* exactly one non-empty line on stderr, ``detr-peg <command>: error: ...``,
  naming the file, field or value at fault, and no traceback;
* every file of the earlier run (``checkpoint.pth``, ``config.yaml``,
  ``metrics.json``, ``detections.json``, ``predictions/``) byte-identical,
  nothing added; ``metrics.jsonl`` keeps its earlier records.

Training cases resume the earlier run for a second epoch with the same
config (``train --resume ... train.epochs=2``), so a broken image is met
while training. Then the inputs that must work: grayscale, RGBA, palette and
16-bit PNGs, an image without annotations, fine-tuning to another number of
classes with ``train.reset_classifier``, and bad samples skipped and counted
with ``data.on_bad_sample=skip``.
"""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from detr_peg.checkpoint.format import read_checkpoint, save_checkpoint
from detr_peg.config import load_config
from detr_peg.models import build_model
from tests.cli_process import CliResult, can_drop_file_access_override
from tests.engine.tiny_run import TINY_MODEL
from tests.reliability.conftest import (
    ANNOTATIONS,
    BASE,
    DATA,
    IMAGES,
    OUT,
    RESUME,
    assert_one_line_error,
    assert_outputs_kept,
    assert_success,
    draw_image,
    edit_annotations,
    read_annotations,
    running_as_root,
    snapshot,
    write_annotations,
)

CHECKPOINT = OUT / "checkpoint.pth"
EVAL = ["eval", "--checkpoint", CHECKPOINT, "--output", OUT]
FINETUNE = ["train", *BASE, f"train.output_dir={OUT / 'finetune'}", "train.epochs=1"]


# ------------------------------------------------------------------ preparations


def _with_image(data: dict, image: dict) -> dict:
    return {**data, "images": [*data["images"], image]}


def _replace_image(name: str, content: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def prepare(case: Path) -> None:
        path = case / IMAGES / name
        path.write_bytes(content(path.read_bytes()))

    return prepare


def _damaged_jpeg_header(data: bytes) -> bytes:
    """The JPEG with its Huffman table overwritten (libjpeg cannot decode it)."""
    at = data.find(b"\xff\xc4")
    assert at > 0
    return data[: at + 4] + b"\xff" * 36 + data[at + 40 :]


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _bomb_png(side: int = 40_000) -> bytes:
    """A 1.6-gigapixel PNG header with a few bytes of data: a decompression bomb (Pillow refuses at open)."""
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + _png_chunk(b"IEND", b"")
    )


def _bomb(case: Path) -> None:
    (case / IMAGES / "bomb.png").write_bytes(_bomb_png())
    data = read_annotations(case)
    data["images"][1]["file_name"] = "bomb.png"
    write_annotations(case, data)


def _outside_file(case: Path) -> Path:
    """A real image outside the image folder (so only the path check can stop it being read)."""
    target = case / "data" / "outside.jpg"
    Image.fromarray(draw_image(9, [], [])).save(target)
    return target


def _escaping_path(case: Path) -> None:
    _outside_file(case)
    edit_annotations(lambda d: d["images"][2].update(file_name="../outside.jpg"))(case)


def _absolute_path(case: Path) -> None:
    target = _outside_file(case)
    edit_annotations(lambda d: d["images"][2].update(file_name=str(target)))(case)


def _exif_turned(case: Path) -> None:
    """img2.jpg stored as a camera stores a photo taken upright (orientation 6), annotated as it is shown."""
    path = case / IMAGES / "img2.jpg"
    with Image.open(path) as image:
        exif = image.getexif()
        exif[0x0112] = 6
        image.save(path, exif=exif)
    edit_annotations(lambda d: d["images"][2].update(width=48, height=64))(case)


def _folder_instead_of_file(case: Path) -> None:
    (case / ANNOTATIONS).unlink()
    (case / ANNOTATIONS).mkdir()


def _unreadable(case: Path) -> None:
    (case / ANNOTATIONS).chmod(0)


def _text(relative: str, text: str) -> Callable[[Path], None]:
    def prepare(case: Path) -> None:
        (case / relative).write_text(text)

    return prepare


def _truncated_checkpoint(case: Path) -> None:
    data = (case / CHECKPOINT).read_bytes()
    (case / "truncated.pth").write_bytes(data[: len(data) // 2])


def _other_architecture(case: Path) -> None:
    """A Deformable-DETR checkpoint with the same backbone and widths as the DETR of the runs."""
    cfg = load_config(
        None,
        [
            *TINY_MODEL,
            "model.backbone.out_stages=[2]",
            "model.arch=deformable_detr",
            "model.transformer.num_feature_levels=1",
            "model.num_classes=2",
        ],
    )
    torch.manual_seed(0)
    save_checkpoint(case / "deformable.pth", cfg, build_model(cfg).state_dict())


def _third_category(case: Path) -> None:
    def change(data: dict) -> None:
        data["categories"].append({"id": 3, "name": "green"})
        data["annotations"].append(
            {"id": 99, "image_id": 1, "category_id": 3, "bbox": [40.0, 4.0, 10.0, 10.0], "area": 100.0, "iscrowd": 0}
        )

    edit_annotations(change)(case)


def _deformable_config(case: Path) -> None:
    (case / "deformable.yaml").write_text(
        "model:\n  arch: deformable_detr\n  transformer:\n    num_feature_levels: 1\n"
    )


# ------------------------------------------------------------------ the matrix


@dataclass
class Case:
    """One bad input.

    Attributes:
        name: the test id.
        args: the command line (paths relative to the case folder).
        fragments: what the error line must contain.
        prepare: breaks the copied case folder.
        needs_no_dac_override: run without root's file-permission override.
    """

    name: str
    args: Sequence
    fragments: Sequence[str]
    prepare: Callable[[Path], None] | None = None
    needs_no_dac_override: bool = False
    marks: Sequence = field(default_factory=tuple)


ANN = str(ANNOTATIONS)
CASES = [
    # annotation file
    Case("annotations-missing", RESUME, [ANN, "does not exist"], lambda c: (c / ANNOTATIONS).unlink()),
    Case(
        "annotations-unreadable",
        RESUME,
        [ANN, "cannot be read", "Permission denied"],
        _unreadable,
        needs_no_dac_override=True,
    ),
    Case("annotations-is-a-folder", RESUME, [ANN, "is a folder"], _folder_instead_of_file),
    Case("invalid-json", RESUME, [ANN, "is not valid JSON", "line 1 column"], _text(ANN, '{"images": [')),
    Case("not-utf8", RESUME, [ANN, "is not UTF-8"], lambda c: (c / ANNOTATIONS).write_bytes(b'{"images": "\xff"}')),
    Case("json-list-not-coco", RESUME, [ANN, "JSON list at the top level"], _text(ANN, "[1, 2]")),
    *[
        Case(f"no-{key}-list", RESUME, [ANN, f"has no '{key}' list"], edit_annotations(lambda d, k=key: d.pop(k)))
        for key in ("images", "annotations", "categories")
    ],
    Case(
        "duplicate-image-id",
        RESUME,
        [ANN, "duplicate images id 1"],
        edit_annotations(lambda d: d["images"][1].update(id=1)),
    ),
    Case(
        "annotation-of-unknown-image",
        RESUME,
        [ANN, "annotation id 1", "image_id 99", "not the id of an image"],
        edit_annotations(lambda d: d["annotations"][0].update(image_id=99)),
    ),
    Case(
        "annotation-of-unknown-category",
        RESUME,
        [ANN, "annotation id 1", "category_id 42", "not the id of a category"],
        edit_annotations(lambda d: d["annotations"][0].update(category_id=42)),
    ),
    Case(
        "bbox-negative-width",
        RESUME,
        [ANN, "annotation id 2", "width is -5.0"],
        edit_annotations(lambda d: d["annotations"][1].update(bbox=[1.0, 2.0, -5.0, 4.0])),
    ),
    Case(
        "bbox-zero-height",
        RESUME,
        [ANN, "annotation id 2", "height is 0"],
        edit_annotations(lambda d: d["annotations"][1].update(bbox=[1.0, 2.0, 5.0, 0])),
    ),
    Case(
        "bbox-nan",
        RESUME,
        [ANN, "annotation id 2", "width is nan"],
        edit_annotations(lambda d: d["annotations"][1].update(bbox=[1.0, 2.0, float("nan"), 4.0])),
    ),
    Case(
        "bbox-wrong-length",
        RESUME,
        [ANN, "annotation id 2", "of length 3"],
        edit_annotations(lambda d: d["annotations"][1].update(bbox=[1.0, 2.0, 5.0])),
    ),
    Case(
        "empty-dataset",
        RESUME,
        [ANN, "empty 'images' list"],
        edit_annotations(lambda d: d.update(images=[], annotations=[])),
    ),
    Case(
        "image-missing",
        RESUME,
        [ANN, "image id 3", "'img2.jpg'", f"not in the image folder {IMAGES}", "data.on_bad_sample=skip"],
        lambda c: (c / IMAGES / "img2.jpg").unlink(),
    ),
    Case(
        "val-image-missing",  # a separate validation file: refused before training, not at its evaluation
        [*RESUME, "data.val_annotations=data/val.json"],
        ["data/val.json", "image id 9", "'gone.jpg'", f"not in the image folder {IMAGES}"],
        lambda c: (c / DATA / "val.json").write_text(
            json.dumps(_with_image(read_annotations(c), {"id": 9, "file_name": "gone.jpg", "width": 64, "height": 48}))
        ),
    ),
    Case(
        "images-folder-of-other-images",
        [*RESUME, "data.val_images=data"],
        ["None of the 4 images of annotation file", ANN, "is in the image folder data", "'img0.jpg'"],
    ),
    # image files, met while training
    Case(
        "jpeg-truncated",
        RESUME,
        [str(IMAGES / "img2.jpg"), "truncated"],
        _replace_image("img2.jpg", lambda b: b[: len(b) // 2]),
    ),
    Case(
        "jpeg-corrupt-header",
        RESUME,
        [str(IMAGES / "img2.jpg"), "corrupt"],
        _replace_image("img2.jpg", _damaged_jpeg_header),
    ),
    Case(
        "not-an-image",
        RESUME,
        [str(IMAGES / "img2.jpg"), "not an image"],
        _replace_image("img2.jpg", lambda b: b"name,x,y\nimg2,1,2\n"),
    ),
    Case(
        "empty-image-file",
        RESUME,
        [str(IMAGES / "img2.jpg"), "not an image"],
        _replace_image("img2.jpg", lambda b: b""),
    ),
    Case(
        "decompression-bomb",
        RESUME,
        [str(IMAGES / "bomb.png"), "too large to decode safely", "downscale it, or, from Python"],
        _bomb,
    ),
    Case(
        "path-escapes-image-folder",
        RESUME,
        [ANN, "image id 3", "'../outside.jpg'", "leaves the image folder"],
        _escaping_path,
    ),
    Case("absolute-image-path", RESUME, [ANN, "image id 3", "outside.jpg", "is absolute"], _absolute_path),
    Case(
        "image-size-differs-from-annotation",
        RESUME,
        [str(IMAGES / "img2.jpg"), "is 48x64", "says 48x60", "image id 3"],
        edit_annotations(lambda d: d["images"][2].update(width=60)),
    ),
    Case(
        "exif-turned-image",
        RESUME,
        [str(IMAGES / "img2.jpg"), "is 48x64", "says 64x48", "its EXIF orientation turns it"],
        _exif_turned,
    ),
    Case(
        "eval-truncated-image",
        EVAL,
        [str(IMAGES / "img0.jpg"), "truncated"],
        _replace_image("img0.jpg", lambda b: b[: len(b) // 2]),
    ),
    # Threshold 0 draws every box, so a picture written before the failure would differ from the earlier one.
    Case(
        "predict-not-an-image",
        [
            "predict",
            "--checkpoint",
            CHECKPOINT,
            IMAGES / "img0.jpg",
            "data/notes.jpg",
            "--output",
            OUT / "predictions",
            "--score-threshold",
            "0",
        ],
        ["data/notes.jpg", "not an image"],
        _text("data/notes.jpg", "not a picture\n"),
    ),
    Case(
        "predict-onnx-on-cuda",
        ["predict", "--onnx", "m.onnx", IMAGES, "--device", "cuda", "--output", OUT / "predictions"],
        ["--device cuda", "--onnx runs in ONNX Runtime on the CPU"],
    ),
    # config
    Case(
        "unknown-config-key",
        [*RESUME, "train.lrr=1e-4"],
        ["command line", "unknown key 'train.lrr'", "valid keys in train are"],
    ),
    Case(
        "unknown-key-in-config-file",
        [*RESUME, "--config", "my.yaml"],
        ["my.yaml", "unknown key 'train.epoch'"],
        _text("my.yaml", "train:\n  epoch: 3\n"),
    ),
    Case("wrong-value-type", [*RESUME, "train.batch_size=two"], ["'train.batch_size' must be an integer", "'two'"]),
    Case(
        "wrong-value-in-config-file",
        [*RESUME, "--config", "my.yaml"],
        ["my.yaml", "'train.lr' must be a number"],
        _text("my.yaml", "train:\n  lr: [1, 2]\n"),
    ),
    Case(
        "invalid-yaml",
        [*RESUME, "--config", "my.yaml"],
        ["my.yaml", "invalid YAML at line 3"],
        _text("my.yaml", "train:\n  lr: [1, 2\n"),
    ),
    Case("config-file-missing", [*RESUME, "--config", "missing.yaml"], ["Config file missing.yaml does not exist"]),
    Case(
        "unknown-option-value",
        [*RESUME, "data.on_bad_sample=ignore"],
        ["'data.on_bad_sample' must be one of 'error', 'skip'", "'ignore'"],
    ),
    # checkpoints
    Case(
        "checkpoint-missing",
        ["eval", "--checkpoint", "missing.pth", "--output", OUT],
        ["The checkpoint file missing.pth does not exist"],
    ),
    Case(
        "checkpoint-truncated",
        ["eval", "--checkpoint", "truncated.pth", "--output", OUT],
        ["truncated.pth", "corrupt or truncated"],
        _truncated_checkpoint,
    ),
    Case(
        "checkpoint-is-json",
        ["eval", "--checkpoint", ANN, "--output", OUT],
        [ANN, "is not a PyTorch checkpoint: it begins with '{", "not as torch.save writes"],
    ),
    Case(
        "checkpoint-of-another-architecture",
        [*FINETUNE, "train.init_from=deformable.pth"],
        ["train.init_from deformable.pth holds a deformable_detr model but model.arch is detr"],
        _other_architecture,
    ),
    Case(
        "config-of-another-architecture",
        [*EVAL, "--config", "deformable.yaml"],
        [str(CHECKPOINT), "model.arch cannot be 'deformable_detr'", "its weights were trained with 'detr'"],
        _deformable_config,
    ),
    Case(
        "checkpoint-with-another-class-count",
        [*FINETUNE, f"train.init_from={CHECKPOINT}"],
        [
            f"train.init_from {CHECKPOINT} was trained with 2 classes but this dataset needs 3",
            "train.reset_classifier=true",
        ],
        _third_category,
    ),
    Case(
        "existing-run-without-resume",
        ["train", *BASE, "train.epochs=2"],
        [str(OUT), "already holds the checkpoint of a training run", "--resume"],
    ),
    Case(
        "resume-checkpoint-truncated",
        RESUME,
        [str(CHECKPOINT), "corrupt or truncated"],
        lambda c: (c / CHECKPOINT).write_bytes((c / CHECKPOINT).read_bytes()[:5000]),
    ),
]


def _run_case(cli, case: Path, spec: Case) -> tuple[CliResult, dict[str, bytes]]:
    limits = []
    if spec.needs_no_dac_override and running_as_root():
        reason = can_drop_file_access_override()
        if reason is not None:
            pytest.skip(f"running as root, where every file is readable, and {reason}")
        limits.append(("no_dac_override",))
    if spec.prepare is not None:
        spec.prepare(case)
    before = snapshot(case / OUT)
    return cli.run(spec.args, cwd=case, limits=limits), before


@pytest.mark.parametrize("spec", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_clear_line_and_damages_nothing(cli, case: Path, spec: Case) -> None:
    result, before = _run_case(cli, case, spec)
    assert_one_line_error(result, *spec.fragments)
    assert_outputs_kept(before, case / OUT)


@pytest.mark.parametrize("name", ["wrong-value-type", "jpeg-truncated"])
def test_a_fresh_interpreter_gives_the_same_result(cli, cold_cli, template: Path, tmp_path: Path, name: str) -> None:
    """The warm command runner (forked children) behaves exactly like ``python -m detr_peg.cli.main``."""
    spec = next(c for c in CASES if c.name == name)
    results = []
    for runner, folder in ((cold_cli, tmp_path / "cold"), (cli, tmp_path / "warm")):
        shutil.copytree(template, folder)
        result, before = _run_case(runner, folder, spec)
        assert_one_line_error(result, *spec.fragments)
        assert_outputs_kept(before, folder / OUT)
        results.append(result)
    assert results[0].returncode == results[1].returncode
    assert results[0].stderr.replace(str(tmp_path / "cold"), "") == results[1].stderr.replace(
        str(tmp_path / "warm"), ""
    )


# ------------------------------------------------------------------ inputs that must work


def _mode_images(case: Path) -> None:
    """Grayscale, RGBA, palette (with transparency) and 16-bit PNGs, and a JPEG without annotations."""
    shutil.rmtree(case / IMAGES)
    (case / IMAGES).mkdir()
    box, other = [6.0, 8.0, 24.0, 16.0], [34.0, 20.0, 20.0, 20.0]
    rgb = [draw_image(20 + i, [box, other], [1 + i % 2, 2 - i % 2]) for i in range(5)]
    grey = rgb[0].mean(axis=2).astype(np.uint8)
    rgba = np.concatenate([rgb[1], np.full((*rgb[1].shape[:2], 1), 128, np.uint8)], axis=2)
    pictures = {
        "grey.png": Image.fromarray(grey, "L"),
        "rgba.png": Image.fromarray(rgba, "RGBA"),
        "palette.png": Image.fromarray(rgb[2]).quantize(16),
        "deep.png": Image.fromarray(grey.astype(np.uint16) * 257).convert("I;16"),
        "nothing.jpg": Image.fromarray(rgb[4]),
    }
    pictures["palette.png"].info["transparency"] = 0
    images, annotations = [], []
    for index, (name, picture) in enumerate(pictures.items(), start=1):
        picture.save(case / IMAGES / name, **({"transparency": 0} if name == "palette.png" else {}))
        images.append({"id": index, "file_name": name, "width": 64, "height": 48})
        if name != "nothing.jpg":
            for ann_box, label in ((box, 1 + index % 2), (other, 2 - index % 2)):
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": index,
                        "category_id": label,
                        "bbox": ann_box,
                        "area": ann_box[2] * ann_box[3],
                        "iscrowd": 0,
                    }
                )
    modes = {name: Image.open(case / IMAGES / name).mode for name in pictures}
    assert modes == {
        "grey.png": "L",
        "rgba.png": "RGBA",
        "palette.png": "P",
        "deep.png": "I;16",
        "nothing.jpg": "RGB",
    }, modes
    write_annotations(
        case, {"images": images, "annotations": annotations, "categories": read_annotations(case)["categories"]}
    )


def test_grayscale_rgba_palette_16bit_and_unannotated_images_train_evaluate_and_predict(cli, case: Path) -> None:
    _mode_images(case)
    trained = cli.run(RESUME, cwd=case)
    assert_success(trained)
    assert "Done: 4 iterations, 2 epochs" in trained.stdout, trained.stdout
    metrics = json.loads((case / OUT / "metrics.json").read_text())
    assert metrics["num_images"] == 5
    predicted = cli.run(["predict", "--checkpoint", CHECKPOINT, IMAGES, "--output", "pred"], cwd=case)
    assert_success(predicted)
    assert sorted(p.name for p in (case / "pred").glob("*.png")) == [
        "deep.png",
        "grey.png",
        "nothing.png",
        "palette.png",
        "rgba.png",
    ]


def test_fine_tuning_to_another_class_count_with_reset_classifier(cli, case: Path) -> None:
    _third_category(case)
    result = cli.run([*FINETUNE, f"train.init_from={CHECKPOINT}", "train.reset_classifier=true"], cwd=case)
    assert_success(result)
    tuned = read_checkpoint(case / OUT / "finetune" / "checkpoint.pth")
    assert tuned.config.model.num_classes == 3
    source = read_checkpoint(case / CHECKPOINT)
    backbone = [k for k in source.model if k.startswith("backbone.")]
    # One epoch of training moved the weights; the class head alone has another shape.
    assert tuned.model["class_embed.weight"].shape[0] == 4 and source.model["class_embed.weight"].shape[0] == 3
    assert backbone and all(tuned.model[k].shape == source.model[k].shape for k in backbone)


def test_boxes_outside_their_image_are_counted(cli, case: Path) -> None:
    edit_annotations(lambda d: d["annotations"][0].update(bbox=[70.0, 5.0, 10.0, 10.0]))(case)  # 64 px wide
    result = cli.run(RESUME, cwd=case)
    assert_success(result)
    assert (
        "1 boxes in data/annotations.json lie entirely outside their image and are left out of the training targets."
    ) in result.stdout, result.stdout


def test_bad_samples_are_skipped_and_counted_only_when_asked(cli, case: Path) -> None:
    (case / IMAGES / "img2.jpg").write_bytes((case / IMAGES / "img2.jpg").read_bytes()[:300])
    edit_annotations(lambda d: d["annotations"][0].update(bbox=[1.0, 2.0, 0.0, 4.0]))(case)  # image 1
    failed = cli.run(RESUME, cwd=case)
    assert_one_line_error(failed, ANN, "annotation id 1", "data.on_bad_sample=skip")
    # Batches of one, so the truncated image is met in training (three images are left, one is unreadable).
    result = cli.run([*RESUME, "data.on_bad_sample=skip", "data.num_workers=1", "train.batch_size=1"], cwd=case)
    assert_success(result)
    assert "1 invalid annotations skipped in data/annotations.json" in result.stdout, result.stdout
    # Both are counted: the image left out for its annotation and the one found unreadable in training.
    skipped = "2 training images skipped so far, unreadable or with invalid annotations (data.on_bad_sample=skip)"
    assert skipped in result.stdout, result.stdout
    assert "skipped images: 2;" in result.stdout
    assert "data/images/img2.jpg" in result.stderr  # the warning names the file
    ckpt = read_checkpoint(case / CHECKPOINT)
    assert ckpt.extra["skipped_image_ids"] == [1, 3] and ckpt.extra["epoch"] == 2
    records = [json.loads(line) for line in (case / "out" / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r.get("type") == "epoch"]
    assert epochs[-1]["skipped_images"] == 2
