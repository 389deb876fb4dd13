"""``detr_peg.Detector``: three lines from a checkpoint to the boxes of a real image, equal to ``detr-peg predict``;
batches that give what one image at a time gives; every input kind; clear errors; evaluation and ONNX.

The checkpoint is the tiny DETR that ``tests/conftest.py`` trains on coco128 with ``detr-peg train``.
"""

from __future__ import annotations

import ast
import base64
import collections
import collections.abc
import contextlib
import io
import itertools
import json
import logging
import math
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.utils.prune
import torchvision
from PIL import Image

import detr_peg
from detr_peg.bounded_read import MAX_ASPECT_RATIO
from detr_peg.cli.main import main
from detr_peg.data.label_map import LabelMap
from detr_peg.data.transforms import build_eval_transforms
from detr_peg.engine.checkpointing import CLASSIFIER_KEY
from detr_peg.engine.mixed_precision import native_bf16
from detr_peg.errors import CheckpointError, ConfigError, DataError
from tests.conftest import run_python
from tests.engine.tiny_run import TINY_MODEL

#: coco128 validation images of five different sizes (portrait and landscape).
SIZES_WANTED = 5


def _images_of_different_sizes(coco128_dir: Path, count: int = SIZES_WANTED) -> list[Path]:
    annotations = json.loads((coco128_dir / "annotations_val.json").read_text())
    chosen, seen = [], set()
    for image in annotations["images"]:
        size = (image["height"], image["width"])
        if size not in seen:
            seen.add(size)
            chosen.append(coco128_dir / "images" / image["file_name"])
        if len(chosen) == count:
            break
    return chosen


@pytest.fixture(scope="module")
def detector(coco128_checkpoint: Path) -> detr_peg.Detector:
    return detr_peg.Detector.from_checkpoint(coco128_checkpoint, device="cpu")


def test_three_lines_give_what_the_command_line_predicts(coco128_checkpoint, coco128_dir, tmp_path) -> None:
    image = _images_of_different_sizes(coco128_dir, 1)[0]
    script = tmp_path / "three_lines.py"
    script.write_text(
        "import detr_peg\n"
        f"detector = detr_peg.Detector.from_checkpoint({str(coco128_checkpoint)!r})\n"
        f"print(detector.predict({str(image)!r}, threshold=0.0).records(1))\n"
    )
    assert len(script.read_text().splitlines()) == 3
    proc = run_python(str(script), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from_script = ast.literal_eval(proc.stdout.strip())
    out = tmp_path / "predicted"
    assert main(["predict", "--checkpoint", str(coco128_checkpoint), str(image), "--output", str(out),
                 "--score-threshold", "0", "--device", "cpu"]) == 0  # fmt: skip
    from_cli = json.loads((out / "predictions.json").read_text())
    assert from_script == from_cli and len(from_cli) == 8  # DETR: one detection per query
    assert all(r["category_name"] and r["file_name"] == str(image) for r in from_cli)
    assert {r["category_id"] for r in from_cli} <= {c["id"] for c in json.loads(
        (coco128_dir / "annotations_val.json").read_text())["categories"]}  # fmt: skip


def _assert_same(a: detr_peg.Detections, b: detr_peg.Detections) -> None:
    assert a.image_size == b.image_size and a.class_names == b.class_names and a.category_ids == b.category_ids
    torch.testing.assert_close(a.boxes, b.boxes, rtol=1e-4, atol=1e-3)  # pixels of images up to 640 px
    torch.testing.assert_close(a.scores, b.scores, rtol=1e-4, atol=1e-6)
    assert torch.equal(a.labels, b.labels)


@pytest.mark.parametrize("arch", ["detr", "deformable_detr"])
def test_a_list_of_sizes_equals_one_image_at_a_time(detector, coco128_dir, arch) -> None:
    if arch == "deformable_detr":  # a random Deformable-DETR of the same size, images resized as the checkpoint's
        torch.manual_seed(0)
        overrides = [*TINY_MODEL, "model.arch=deformable_detr", "model.transformer.num_feature_levels=2",
                     "model.num_classes=80", "data.val_scale=96", "data.val_max_size=128"]  # fmt: skip
        detector = detr_peg.Detector.from_config(None, overrides, device="cpu")
    paths = _images_of_different_sizes(coco128_dir)
    sizes = {Image.open(p).size for p in paths}
    assert len(sizes) == SIZES_WANTED
    together = detector.predict(paths, threshold=0.0, batch_size=3)
    assert [d.source for d in together] == [str(p) for p in paths]
    for path, batched in zip(paths, together):
        alone = detector.predict(path, threshold=0.0)
        _assert_same(batched, alone)
        with Image.open(path) as picture:
            assert batched.image_size == (picture.height, picture.width)
        # boxes are in pixels of the original image
        assert float(batched.boxes[:, 2].max()) <= batched.image_size[1] * 1.5
    # another batch size, another grouping: the same detections
    for a, b in zip(together, detector.predict(paths, threshold=0.0, batch_size=1)):
        _assert_same(a, b)


def test_every_input_kind_gives_the_same_detections(detector, coco128_dir) -> None:
    path = _images_of_different_sizes(coco128_dir, 1)[0]
    with Image.open(path) as opened:
        picture = opened.convert("RGB")
    array = np.array(picture)
    uint8 = torch.from_numpy(array).permute(2, 0, 1)
    results = detector.predict([path, picture, array, uint8, uint8.float() / 255], threshold=0.0)
    generated = detector.predict((item for item in [path, array]), threshold=0.0)  # an iterator is a list
    for other in [*results[1:], *generated]:
        other.source = results[0].source
        _assert_same(other, results[0])
    bgr = np.ascontiguousarray(array[:, :, ::-1])  # as OpenCV reads the picture
    bgr_tensor = torch.from_numpy(bgr).permute(2, 0, 1)
    for from_bgr in detector.predict([bgr, bgr_tensor, bgr_tensor.float() / 255], threshold=0.0, channels="BGR"):
        from_bgr.source = results[0].source
        _assert_same(from_bgr, results[0])
    for known in (path, picture):  # a file and a PIL image know their channel order
        with pytest.raises(DataError, match=r"^Image 2 (\(.+\) )?is a file or PIL image, whose channel order is known"):
            detector.predict([bgr, known], channels="BGR")
    read_as_rgb = detector.predict(bgr, threshold=0.0)  # the same array taken as RGB: other colours, other detections
    assert not torch.equal(read_as_rgb.scores, results[0].scores)
    with pytest.raises(ConfigError, match="channels must be 'RGB' or 'BGR', got 'bgr'"):
        detector.predict(bgr, channels="bgr")
    threshold = float(results[0].scores[3])
    kept = detector.predict(path, threshold=threshold)
    assert len(kept) == int((results[0].scores >= threshold).sum()) and bool((kept.scores >= threshold).all())
    assert kept.scores.tolist() == sorted(kept.scores.tolist(), reverse=True)


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (np.zeros((4, 5, 3), dtype=np.float32), "dtype float32"),
        (np.zeros((4, 5, 4), dtype=np.uint8), "shape (4, 5, 4)"),
        (torch.zeros(1, 8, 8), "shape (1, 8, 8)"),
        (torch.full((3, 8, 8), 2.0), "outside [0, 1]"),
        (torch.full((3, 8, 8), float("nan")), "holding NaN or infinite values"),
        (torch.rand(3, 8, 8).to_sparse(), "layout torch.sparse_coo; expected a dense one"),
        (Image.new("RGB", (0, 64)), "is empty (64 x 0 pixels)"),
        (torch.zeros(3, 8, 8, dtype=torch.int32), "dtype torch.int32"),
        ([1, 2, 3], "is a list"),
        ("does/not/exist.jpg", "does not exist"),
    ],
)
def test_bad_inputs_are_one_sentence_naming_the_image(detector, bad, words) -> None:
    with pytest.raises(DataError) as info:
        detector.predict([torch.zeros(3, 32, 32, dtype=torch.uint8), bad])
    message = str(info.value)
    named = "does/not/exist.jpg" in message if isinstance(bad, str) else message.startswith("Image 2")
    assert named and words in message and "\n" not in message


def test_encoded_bytes_streams_and_urls_are_refused_unread(detector, coco128_dir) -> None:
    """What a web handler holds (an upload's bytes, a stream, base64 text, a URL) is one input, named and refused
    without being read: a stream was iterated line by line (/dev/zero without end), bytes split into integers."""
    path = _images_of_different_sizes(coco128_dir, 1)[0]
    data = path.read_bytes()
    with open("/dev/zero", "rb") as endless, io.BytesIO(data) as upload:
        for bad in (data, bytearray(data), memoryview(data), os.fsencode(path), upload, endless):
            with pytest.raises(DataError, match=rf"^Image 1 is a {type(bad).__name__}: encoded bytes or a stream, "
                               r"not an image; decode it with PIL.Image.open\(io.BytesIO\(data\)\)"):  # fmt: skip
                detector.predict(bad)
        assert upload.tell() == 0 and endless.tell() == 0
        _assert_same(detector.predict(Image.open(upload)), detector.predict(path))  # the way the message names
    for text, words in ((base64.b64encode(data).decode(), f"a string of {len(base64.b64encode(data))} characters"),
                        ("https://example.com/x.jpg", "a URL")):  # fmt: skip
        with pytest.raises(
            DataError, match=rf"^Image 1 (\([^)]*\) )?is {words}[^;]*; images are read from files"
        ) as info:
            detector.predict(text)
        assert len(str(info.value)) < 200


def test_an_image_far_longer_than_wide_is_detected_at_one_pixel_of_height(detector) -> None:
    # At the longest aspect ratio an image file may have, the resize rule would make the short side 1.3 px
    # (data.val_max_size caps the long side); it stays 1 px.
    long = int(MAX_ASPECT_RATIO)
    strip = torch.randint(0, 256, (3, 1, long), dtype=torch.uint8)
    found = detector.predict([strip, strip.transpose(1, 2)], threshold=0.0)
    assert [f.image_size for f in found] == [(1, long), (long, 1)]
    assert all(len(f) == detector.config.model.num_queries and bool(torch.isfinite(f.boxes).all()) for f in found)
    # The model saw the strip at 1 x val_max_size px, and its boxes come back in the strip's pixels.
    seen = build_eval_transforms(detector.config.data)(torchvision.tv_tensors.Image(strip))
    assert tuple(seen.shape) == (3, 1, detector.config.data.val_max_size)
    assert bool((found[0].boxes[:, 2] <= long).all()) and bool((found[0].boxes[:, 3] <= 1).all())
    # One pixel longer, an array or a tensor is refused as an image file of that shape is.
    for longer in (torch.zeros(3, 1, long + 1, dtype=torch.uint8), np.zeros((long + 1, 1, 3), dtype=np.uint8)):
        with pytest.raises(DataError, match=rf"^Image 1 is \d+ x \d+ pixels, an aspect ratio above {long}:1"):
            detector.predict(longer)


@pytest.mark.parametrize(
    ("setting", "value", "words"),
    [("threshold", 1.5, "threshold must be a number from 0 to 1, got 1.5."),
     ("threshold", "0.5", "threshold must be a number from 0 to 1, got '0.5'."),
     ("threshold", [0.5], "threshold must be a number from 0 to 1, got [0.5]."),
     ("threshold", float("nan"), "threshold must be a number from 0 to 1, got nan."),
     ("batch_size", 0, "batch_size must be a whole number from 1 to 100000, got 0."),
     ("batch_size", None, "batch_size must be a whole number from 1 to 100000, got None."),
     ("batch_size", "8", "batch_size must be a whole number from 1 to 100000, got '8'."),
     ("batch_size", True, "batch_size must be a whole number from 1 to 100000, got True.")],
)  # fmt: skip
def test_bad_settings_are_one_sentence(detector, setting, value, words: str) -> None:
    image = torch.zeros(3, 32, 32, dtype=torch.uint8)
    with pytest.raises(ConfigError) as refused:
        detector.predict(image, **{setting: value})
    assert str(refused.value) == words


def test_detector_amp_is_used_or_refused_never_ignored(detector, monkeypatch) -> None:
    """``detector.amp`` runs predict under that autocast, or is refused when set, as ``train.amp`` would be."""
    from detr_peg.engine import inference

    image, used = torch.zeros(3, 32, 32, dtype=torch.uint8), []
    monkeypatch.setattr(inference, "autocast", lambda amp, device: used.append(amp) or contextlib.nullcontext())
    cases = (("banana", False), (16, False), ("fp16", False), ("bf16", native_bf16(detector.device)), ("auto", True))
    for amp, works in cases:
        if works:
            detector.amp = amp
            detector.predict(image)
            assert used[-1] == amp
        else:
            with pytest.raises(ConfigError, match=r"^Detector.amp"):
                detector.amp = amp
            assert detector.amp != amp  # the refused value is not kept
    detector.amp = "none"


def test_evaluate_equals_the_command_line(detector, coco128_checkpoint, coco128_dir, tmp_path) -> None:
    metrics = detector.evaluate(coco128_dir / "images", coco128_dir / "annotations_val.json")
    out = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(coco128_checkpoint), "--output", str(out), "train.device=cpu"]) == 0
    assert metrics == pytest.approx(json.loads((out / "metrics.json").read_text())["bbox"], abs=1e-12)


class _PathObject(os.PathLike):
    """A path type of the user's own, whose ``str`` is not the path."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __fspath__(self) -> str:
        return self.path


class _Frames(collections.abc.Sequence):
    def __init__(self, items: list) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def test_any_sequence_and_any_path_type_the_hints_allow(detector, coco128_checkpoint, coco128_dir) -> None:
    paths = _images_of_different_sizes(coco128_dir, 2)
    expected = detector.predict(paths, threshold=0.0)
    for images in (collections.UserList(paths), _Frames(paths), [_PathObject(p) for p in paths]):
        got = detector.predict(images, threshold=0.0)
        assert isinstance(got, list) and [d.source for d in got] == [str(p) for p in paths]
        for a, b in zip(got, expected):
            _assert_same(a, b)
    reloaded = detr_peg.Detector.from_checkpoint(_PathObject(coco128_checkpoint), device="cpu")
    _assert_same(reloaded.predict(_PathObject(paths[0]), threshold=0.0), expected[0])
    as_objects = reloaded.evaluate(
        _PathObject(coco128_dir / "images"), _PathObject(coco128_dir / "annotations_val.json")
    )
    assert as_objects == detector.evaluate(coco128_dir / "images", coco128_dir / "annotations_val.json")


def test_a_model_the_user_resized_or_broke_is_refused_before_use(coco128_checkpoint, coco128_dir, tmp_path) -> None:
    """A class head of another size, non-finite weights, and what torch tooling leaves (a quantized module, a
    parameter made a plain tensor) are refused by every method, nothing written."""
    image = _images_of_different_sizes(coco128_dir, 1)[0]
    resized = detr_peg.Detector.from_checkpoint(coco128_checkpoint, device="cpu")
    name, head = next((n, m) for n, m in resized.model.named_modules() if "class_embed" in n and hasattr(m, "weight"))
    parent, _, child = name.rpartition(".")
    setattr(resized.model.get_submodule(parent), child, torch.nn.Linear(head.in_features, 5))
    message = rf"^detector.model's '{name}.bias' is \(5,\), not the \({head.out_features},\) of its config"
    for call in (lambda: resized.predict(image), lambda: resized.export_onnx(tmp_path / "m.onnx"),
                 lambda: resized.evaluate(coco128_dir / "images", coco128_dir / "annotations_val.json"),
                 lambda: resized.save_pretrained(tmp_path / "hub")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            call()
    broken = detr_peg.Detector.from_checkpoint(coco128_checkpoint, device="cpu")
    with torch.no_grad():
        broken.model.get_parameter(f"{name}.weight")[0, 0] = float("nan")
    quantized = detr_peg.Detector.from_checkpoint(coco128_checkpoint, device="cpu")
    torch.ao.quantization.quantize_dynamic(quantized.model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    tied = detr_peg.Detector.from_config(
        None, [*TINY_MODEL, "model.arch=deformable_detr", "model.num_classes=3", "model.transformer.dec_layers=2"]
    )
    assert tied.model.class_embed[0] is tied.model.class_embed[1]  # official layout without box refinement
    head = {"class_embed.0.weight": torch.zeros_like(tied.model.class_embed[0].weight)}
    torch.func.functional_call(
        tied.model.eval(), head, (torch.zeros(1, 3, 512, 512), torch.zeros(1, 512, 512, dtype=torch.bool))
    )
    pruned = detr_peg.Detector.from_checkpoint(coco128_checkpoint, device="cpu")
    torch.nn.utils.prune.l1_unstructured(pruned.model.get_submodule(name), "weight", amount=0.5)
    refusals = [
        (pruned, ConfigError, rf"'{name}.weight' is gone, .*: call torch.nn.utils.prune.remove or parametrize.remove"),
        (broken, CheckpointError, rf"'{name}.weight' holds 1 non-finite values \(nan\): its outputs would be wrong"),
        (quantized, ConfigError, r"'.*_packed_params.dtype' is a dtype, not a tensor: the detector runs the float32"),
        (tied, ConfigError, r"parameter 'class_embed.0.weight' is a plain tensor now \(torch.func.functional_call"),
    ]
    calls = {"predict": [image], "export_onnx": [tmp_path / "m.onnx"], "save_pretrained": [tmp_path / "hub"],
             "evaluate": [coco128_dir / "images", coco128_dir / "annotations_val.json"]}  # fmt: skip
    for (model, error, says), (method, args) in itertools.product(refusals, calls.items()):
        with pytest.raises(error, match=rf"^detector.model's {says}"):
            getattr(model, method)(*args)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("edit", "says"),
    [(lambda c: setattr(c.model, "num_queries", 2.5), "'model.num_queries' must be an integer, got 2.5."),
     (lambda c: setattr(c.model.transformer, "nheads", 0), "'model.transformer.nheads' must be in [1, 1024], got 0."),
     (lambda c: setattr(c, "model", None), "'model' is a section and needs a mapping of keys, got None."),
     (lambda c: delattr(c.data, "train_scales"), "'DataConfig' object has no attribute 'train_scales'.")],
    ids=["fraction", "out-of-range", "section-replaced", "field-deleted"],
)  # fmt: skip
def test_a_config_edited_in_python_is_checked_as_a_file_is(edit, says, coco128_checkpoint, coco128_dir, tmp_path):
    """Every entry point that takes a Config checks it again: the loader's sentence, not an error deep in torch."""
    from detr_peg.config.loader import save_config
    from detr_peg.models.builder import build_criterion, build_model

    cfg = detr_peg.load_config("demo", ["model.num_classes=80"])
    edit(cfg)
    data = {"train_images": coco128_dir / "images", "train_annotations": coco128_dir / "annotations_train.json"}
    calls = [lambda: build_model(cfg), lambda: build_criterion(cfg), lambda: save_config(cfg, tmp_path / "c.yaml"),
             lambda: detr_peg.Detector.from_checkpoint(coco128_checkpoint, config=cfg),
             lambda: detr_peg.Detector.from_config(cfg), lambda: detr_peg.Detector.train(cfg, tmp_path / "run", **data)]  # fmt: skip
    for call in calls:
        with pytest.raises(ConfigError, match=f"^the Config object: {re.escape(says)}$"):
            call()
    assert list(tmp_path.iterdir()) == []


def test_a_detector_keeps_its_file_wherever_the_process_goes(coco128_checkpoint, coco128_dir, tmp_path, monkeypatch):
    """fine_tune starts from the detector's file: a relative path, kept as given, named another file after chdir."""
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "ck.pth").write_bytes(coco128_checkpoint.read_bytes())
    monkeypatch.chdir(tmp_path / "one")
    moved = detr_peg.Detector.from_checkpoint("ck.pth", device="cpu")
    monkeypatch.chdir(tmp_path)
    assert moved.loaded.source == str(tmp_path / "one" / "ck.pth")
    (tmp_path / "one" / "ck.pth").unlink()
    data = {"train_images": coco128_dir / "images", "train_annotations": coco128_dir / "annotations_train.json"}
    with pytest.raises(ConfigError, match=rf"^No file holds the weights of {re.escape(moved.loaded.source)} \(conver"):
        moved.fine_tune(tmp_path / "run", **data)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("default", ["float64", "meta"])
def test_the_callers_default_dtype_and_device_change_nothing(
    default, detector, coco128_checkpoint, coco128_dir, tmp_path
):
    """Built and run in float32 on the CPU whatever torch's defaults are (from_checkpoint under a meta default was
    NotImplementedError, export under float64 a TorchExportError); the caller's defaults stay."""
    image = _images_of_different_sizes(coco128_dir, 1)[0]
    expected = detector.predict(image, threshold=0.0)
    set_default = {"float64": torch.set_default_dtype, "meta": torch.set_default_device}[default]
    set_default(getattr(torch, default) if default == "float64" else default)
    try:
        loaded = detr_peg.Detector.from_checkpoint(coco128_checkpoint, device="cpu")
        _assert_same(loaded.predict(image, threshold=0.0), expected)
        if default == "float64":
            loaded.export_onnx(tmp_path / "m.onnx", image_size=(96, 128), batch_size=1)
        assert (torch.get_default_dtype(), str(torch.get_default_device())) == (
            (torch.float64, "cpu") if default == "float64" else (torch.float32, "meta")
        )
    finally:
        torch.set_default_dtype(torch.float32)
        torch.set_default_device(None)


def test_a_detector_predicts_in_a_forked_child(detector, coco128_dir, tmp_path) -> None:
    """A child forked after torch ran in parallel (a server's preforked workers) gets the parent's detections; its
    first parallel op waited forever for the parent's OpenMP threads. (One thread sums in another order than two.)"""
    image, threads = _images_of_different_sizes(coco128_dir, 1)[0], torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expected = detector.predict(image, threshold=0.0)  # starts the parent's thread pool
        pid = os.fork()
        if pid == 0:
            try:
                found = detector.predict(image, threshold=0.0)
                torch.save({"boxes": found.boxes, "scores": found.scores, "labels": found.labels}, tmp_path / "c.pt")
            finally:
                os._exit(0)
        for _ in range(600):
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
            time.sleep(0.2)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("predict in the forked child did not return within 120 s")
    finally:
        torch.set_num_threads(threads)
    found = torch.load(tmp_path / "c.pt")
    torch.testing.assert_close(found, {"boxes": expected.boxes, "scores": expected.scores, "labels": expected.labels})


def test_class_names_and_supervision(detector, coco128_dir) -> None:
    assert len(detector.class_names) == 80 and detector.class_names[0] == "person"
    detections = detector.predict(_images_of_different_sizes(coco128_dir, 1)[0], threshold=0.0)
    assert "Detections(8 in a" in repr(detections)
    supervision = pytest.importorskip("supervision")
    converted = detections.to_supervision()
    assert isinstance(converted, supervision.Detections)
    np.testing.assert_array_equal(converted.xyxy, detections.boxes.numpy())
    assert converted.class_id.tolist() == detections.category_ids
    assert converted.data["class_name"].tolist() == detections.class_names


@pytest.mark.slow
def test_onnx_export_predicts_as_pytorch(detector, coco128_checkpoint, coco128_dir, tmp_path, caplog) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    with caplog.at_level(logging.INFO, logger="detr_peg"):
        path = detector.export_onnx(tmp_path / "model.onnx", optimize=False)
    # Logged before the export starts (minutes for a full-size model with dynamic sizes on a CPU).
    said = (
        f"exporting {detector.config.model.arch} to {path} with dynamic batch and size (can take minutes on a CPU) ..."
    )
    assert [r.getMessage() for r in caplog.records if r.name == "detr_peg.export.onnx_export"] == [said]
    in_onnx = detr_peg.Detector.from_onnx(path)
    assert in_onnx.config == detector.config and in_onnx.label_map == detector.label_map
    for fixed in ("model.num_classes=7", "model.arch=deformable_detr"):  # the graph fixes the model
        with pytest.raises(ConfigError, match=rf"^{fixed.split('=')[0]} cannot be overridden: the ONNX graph"):
            detr_peg.Detector.from_onnx(path, overrides=iter(["eval.score_threshold=0.5", fixed]))
    assert (
        detr_peg.Detector.from_onnx(path, overrides=iter(["eval.score_threshold=0.5"])).config.eval.score_threshold
        == 0.5
    )
    with pytest.raises(ConfigError, match=r"^A detector from an ONNX graph has no weights to train"):
        in_onnx.fine_tune(tmp_path / "run", train_images=coco128_dir, train_annotations=coco128_dir / "x.json")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=r"^This detector runs the ONNX graph .*model.onnx, an export already"):
        in_onnx.export_onnx(tmp_path / "again.onnx")
    with pytest.raises(ConfigError, match=r"^Detector.amp 'bf16': an ONNX graph runs in float32"):
        in_onnx.amp = "bf16"
    assert in_onnx.amp == "none"
    # evaluate runs the graph as predict does: the same COCO numbers as the checkpoint, to rounding.
    annotations = coco128_dir / "annotations_val.json"
    expected = detector.evaluate(coco128_dir / "images", annotations)
    torch.testing.assert_close(in_onnx.evaluate(coco128_dir / "images", annotations), expected, atol=0.05, rtol=0)
    paths = _images_of_different_sizes(coco128_dir, 3)
    # predict runs in float32 by default, also for a config trained under autocast (train.amp=auto is bf16 on a
    # CPU with AMX): PyTorch and ONNX Runtime agree within 1e-3 px and 1e-6 in score, every detection.
    auto = detr_peg.Detector.from_checkpoint(coco128_checkpoint, device="cpu", overrides=["train.amp=auto"])
    assert detector.amp == auto.amp == "none"
    for a, b, c in zip(
        in_onnx.predict(paths, threshold=0.0),
        detector.predict(paths, threshold=0.0),
        auto.predict(paths, threshold=0.0),
    ):
        _assert_same(a, b)
        _assert_same(a, c)


def test_fine_tune_is_the_training_run_of_the_command_line(detector, coco128_checkpoint, tiny_demo_dir, tmp_path):
    """From the coco128 detector to the demo's four shapes: the class head is reset, the rest starts from it."""
    data = tiny_demo_dir / "data"
    paths = {"train_images": data / "train", "train_annotations": data / "annotations_train.json"}
    schedule = ["train.max_iters=2", "train.batch_size=4"]
    with pytest.raises(CheckpointError, match=r"needs 4; set train\.reset_classifier=true to fine-tune"):
        detector.fine_tune(tmp_path / "refused", **paths, overrides=schedule)
    reset = [*schedule, "train.reset_classifier=true"]
    tuned = detector.fine_tune(tmp_path / "api", **paths, overrides=reset)
    assert tuned.config.model.num_classes == 4 and tuned.class_names == ["circle", "square", "triangle", "cross"]
    assert tuned.loaded.source == str(tmp_path / "api" / "checkpoint.pth") and tuned.loaded.iteration == 2
    # The same call again: the folder holds that run; the message says how to continue it from Python.
    again = r"api already holds the checkpoint of a training run .*in Python, overrides=\['train\.resume=true'\]"
    with pytest.raises(detr_peg.UserError, match=again):
        detector.fine_tune(tmp_path / "api", **paths, overrides=reset)
    longer = detector.fine_tune(tmp_path / "api", **paths, overrides=[*reset, "train.max_iters=3", "train.resume=true"])
    assert longer.loaded.iteration == 3

    args = ["train", "--config", str(coco128_checkpoint.parent / "config.yaml"), "--output", str(tmp_path / "cli")]
    args += [f"train.init_from={coco128_checkpoint}", "model.num_classes=null", "train.device=cpu", *reset]
    args += [f"data.{key}={value}" for key, value in paths.items()]
    assert main([*args, "data.val_images=null", "data.val_annotations=null"]) == 0
    by_command = detr_peg.Detector.from_checkpoint(tmp_path / "cli" / "checkpoint.pth", device="cpu")
    torch.testing.assert_close(tuned.model.state_dict(), by_command.model.state_dict(), rtol=0, atol=0)

    # Without steps the weights are the checkpoint's, all but the fresh class head.
    still = detector.fine_tune(tmp_path / "still", **paths, overrides=[*reset, "train.lr=0", "train.lr_backbone=0"])
    start = dict(detector.model.named_parameters())
    kept = {name: p for name, p in still.model.named_parameters() if CLASSIFIER_KEY not in name}
    assert len(kept) == len(start) - 2  # the class head's weight and bias
    torch.testing.assert_close(kept, {name: start[name] for name in kept}, rtol=0, atol=0)
    # A fine-tune starts as its own call says: the reset of the run it continues is not inherited (it was, and the
    # trained head was thrown away).
    assert longer.config.train.reset_classifier
    second = longer.fine_tune(tmp_path / "second", **paths, overrides=[*schedule, "train.lr=0", "train.lr_backbone=0"])
    assert not second.config.train.reset_classifier
    torch.testing.assert_close(
        dict(second.model.named_parameters()), dict(longer.model.named_parameters()), rtol=0, atol=0
    )


def test_fine_tune_refuses_half_a_validation_pair_and_a_string_of_overrides(detector, tiny_demo_dir, tmp_path):
    data = tiny_demo_dir / "data"
    paths = {"train_images": data / "train", "train_annotations": data / "annotations_train.json"}
    with pytest.raises(detr_peg.UserError, match=r"^Training got val_images alone: val_images and val_annotations"):
        detector.fine_tune(tmp_path / "run", **paths, val_images=data / "val")
    with pytest.raises(detr_peg.UserError, match=r"^overrides: overrides are a list of key=value strings, got the"):
        detector.fine_tune(tmp_path / "run", **paths, overrides="train.max_iters=2")
    with pytest.raises(ConfigError, match=r"^overrides: unknown key 'train\.lrr'"):
        detector.fine_tune(tmp_path / "run", **paths, overrides=["train.lrr=1"])
    assert not (tmp_path / "run").exists()


def test_constructors_check_the_types_of_their_arguments(tmp_path) -> None:
    with pytest.raises(TypeError, match=r"^label_map must be a LabelMap \(detr_peg.data.label_map\), got dict\.$"):
        detr_peg.Detector.from_config(None, [*TINY_MODEL, "model.num_classes=1"], label_map={"a": 1}, device="cpu")
    with pytest.raises(ConfigError, match=r"^overrides: overrides are key=value strings, got 5 \(int\)\.$"):
        detr_peg.Detector.from_config(None, [*TINY_MODEL, 5], device="cpu")
    with pytest.raises(TypeError, match=r"^config must be a Config \(detr_peg.load_config\), got dict\.$"):
        detr_peg.Detector.from_checkpoint(tmp_path / "any.pth", config={"model": {}}, device="cpu")
    with pytest.raises(TypeError, match=r"^config must be a config file's path or a shipped config's name, got 5\.$"):
        detr_peg.Detector.from_config(5, device="cpu")


def test_a_detector_from_a_config_fine_tunes_from_that_config(tiny_demo_dir, tmp_path) -> None:
    data = tiny_demo_dir / "data"
    fresh = detr_peg.Detector.from_config(None, [*TINY_MODEL, "model.num_classes=4"], device="cpu")
    overrides = ["train.max_iters=1", "train.batch_size=2", "data.train_scales=[64]", "data.train_max_size=64"]
    tuned = fresh.fine_tune(
        tmp_path / "run",
        train_images=data / "train",
        train_annotations=data / "annotations_train.json",
        overrides=overrides,
    )
    assert tuned.loaded.iteration == 1 and tuned.config.train.init_from is None
    assert tuned.class_names == ["circle", "square", "triangle", "cross"]  # from the dataset: the fresh one had none
    assert tuned.config.model == fresh.config.model


def test_override_errors_name_where_the_overrides_came_from(coco128_checkpoint, coco128_dir) -> None:
    with pytest.raises(ConfigError, match=r"^overrides: unknown key 'eval\.num_selec'"):
        detr_peg.Detector.from_checkpoint(coco128_checkpoint, overrides=["eval.num_selec=5"])
    image = str(_images_of_different_sizes(coco128_dir, 1)[0])
    proc = run_python(
        "-m", "detr_peg.cli.main", "predict", "--checkpoint", str(coco128_checkpoint), image, "eval.num_selec=5"
    )
    assert proc.returncode == 2 and proc.stderr.startswith("detr-peg predict: error: command line: unknown key")


@pytest.mark.parametrize("target", ["training checkpoint", "user's file", "folder"])
def test_export_onnx_never_replaces_what_it_did_not_write(detector, coco128_checkpoint, tmp_path, target) -> None:
    """Rule: the Python API writes under the command line's output rules; the file is left byte for byte."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(coco128_checkpoint.parent, run)  # the run with its ownership record: checkpoint.pth is train's
    path = {"training checkpoint": run / "checkpoint.pth", "user's file": tmp_path / "mine.onnx",
            "folder": tmp_path / "folder"}[target]  # fmt: skip
    if target == "user's file":
        path.write_bytes(b"mine")
    elif target == "folder":
        path.mkdir()
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(detr_peg.errors.UserError) as refused:
        detector.export_onnx(path)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    "options",
    [{"opset": "18"}, {"opset": None}, {"opset": 18.0}, {"opset": True}, {"image_size": 64},
     {"image_size": ("64", "64")}, {"image_size": (64, 64, 3)}, {"batch_size": True}, {"batch_size": 2.0},
     {"postprocess": "no"}, {"optimize": 1}],
)  # fmt: skip
def test_export_options_are_checked_as_the_command_line_parses_them(detector, tmp_path, options) -> None:
    """Each wrong type is one sentence naming the option, before any tracing, and nothing is written."""
    ((name, value),) = options.items()
    with pytest.raises(ConfigError, match=r"^(--)?[-\w]+ must be ") as refused:
        detector.export_onnx(tmp_path / "m.onnx", **options)
    assert repr(value) in str(refused.value) and "\n" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("call", ["export_onnx", "save_pretrained", "evaluate", "evaluate_scales"])
@pytest.mark.parametrize(
    ("name", "error", "message"),
    [("", detr_peg.errors.UserError, r"^[-\w]+ is empty \(''\); give a file or folder name\.$"),
     (5, TypeError, r"^[-\w]+ must be a path \(str or os\.PathLike\), got 5\.$")],
)  # fmt: skip
def test_an_empty_or_non_path_output_is_refused(detector, tmp_path, monkeypatch, call, name, error, message) -> None:
    """Path("") is the current folder: each writing call refuses it, and nothing is written there."""
    monkeypatch.chdir(tmp_path)
    write = {"export_onnx": lambda: detector.export_onnx(name), "save_pretrained": lambda: detector.save_pretrained(name),
             "evaluate": lambda: detector.evaluate(output_dir=name),
             "evaluate_scales": lambda: detector.evaluate_scales(name, scales=[1.0])}[call]  # fmt: skip
    with pytest.raises(error, match=message):
        write()
    assert list(tmp_path.iterdir()) == []


def test_a_refused_scale_evaluation_leaves_no_folder(detector, tmp_path) -> None:
    """Canvas scales need synthetic data; coco128 is refused after the output folder was claimed, which is undone."""
    with pytest.raises(detr_peg.errors.UserError, match="canvas"):
        detector.evaluate_scales(tmp_path / "new" / "scales", canvas_scales=[2.0])
    assert list(tmp_path.iterdir()) == []


def test_detections_clip_boxes_to_the_image() -> None:
    """Boxes a user gets end at the picture's border; the scores, labels and order are the post-processor's."""
    from detr_peg.detections import Detections

    raw = {
        "scores": torch.tensor([0.2, 0.9, 0.5]),
        "labels": torch.tensor([1, 2, 3]),
        "boxes": torch.tensor([[-17.2, 280.8, 62.2, 341.7], [10.0, 20.0, 30.0, 40.0], [600.0, -5.0, 700.5, 480.0]]),
    }
    detections = Detections.from_postprocessed(raw, threshold=0.3, label_map=None, image_size=(427, 640))
    torch.testing.assert_close(detections.scores, torch.tensor([0.9, 0.5]))
    torch.testing.assert_close(detections.labels, torch.tensor([2, 3]))
    torch.testing.assert_close(detections.boxes, torch.tensor([[10.0, 20.0, 30.0, 40.0], [600.0, 0.0, 640.0, 427.0]]))
    kept = Detections.from_postprocessed(raw, threshold=0.0, label_map=None, image_size=(427, 640))
    torch.testing.assert_close(kept.boxes[2], torch.tensor([0.0, 280.8, 62.2, 341.7]))
    # With data.contiguous_labels=false a label is a category id; one that no category has (2 here) is no
    # detection, as COCO evaluation drops it.
    sparse = LabelMap(category_ids=[1, 3], names=["cat", "dog"], contiguous=False)
    named = Detections.from_postprocessed(raw, threshold=0.0, label_map=sparse, image_size=(427, 640))
    assert (named.category_ids, named.class_names) == ([3, 1], ["dog", "cat"])
    torch.testing.assert_close(named.scores, torch.tensor([0.5, 0.2]))
    # The threshold is compared in float64: one just above a float32 score drops it (it was kept).
    above = math.nextafter(float(raw["scores"][2]), 1.0)
    assert Detections.from_postprocessed(
        raw, threshold=above, label_map=None, image_size=(427, 640)
    ).scores.tolist() == [pytest.approx(0.9)]


def test_train_from_python_is_the_training_run_of_the_command_line(tiny_demo_dir, tmp_path) -> None:
    """Detector.train from a config: model.num_classes from the data, the weights of `detr-peg train` bit for bit,
    and the config's validation data evaluated as the command evaluates it."""
    data = tiny_demo_dir / "data"
    config = tmp_path / "with_val.yaml"
    config.write_text(f"data:\n  val_images: {data / 'val'}\n  val_annotations: {data / 'annotations_val.json'}\n")
    overrides = [*TINY_MODEL, "train.max_iters=2", "train.batch_size=2", "data.train_scales=[64]",
                 "data.train_max_size=64", "data.val_scale=64", "data.val_max_size=64", "train.device=cpu"]  # fmt: skip
    trained = detr_peg.Detector.train(
        config,
        tmp_path / "api",
        train_images=data / "train",
        train_annotations=data / "annotations_train.json",
        overrides=[*overrides, f"train.output_dir={tmp_path / 'elsewhere'}", "train.device=cuda"],
        device="cpu",
    )  # the arguments win over overrides, as the command's options do
    assert not (tmp_path / "elsewhere").exists() and trained.config.train.device == "cpu"
    assert trained.config.model.num_classes == 4 and trained.loaded.iteration == 2
    assert trained.class_names == ["circle", "square", "triangle", "cross"]
    args = ["train", "--config", str(config), "--output", str(tmp_path / "cli"), *overrides,
            f"data.train_images={data / 'train'}", f"data.train_annotations={data / 'annotations_train.json'}"]  # fmt: skip
    assert main(args) == 0
    by_command = detr_peg.Detector.from_checkpoint(tmp_path / "cli" / "checkpoint.pth", device="cpu")
    torch.testing.assert_close(trained.model.state_dict(), by_command.model.state_dict(), rtol=0, atol=0)
    evaluated = [json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("api", "cli")]
    assert evaluated[0]["bbox"] == evaluated[1]["bbox"] and evaluated[0]["iteration"] == 2


def test_detections_draw_boxes_in_a_colour_per_category(tmp_path) -> None:
    from detr_peg.detections import Detections, category_color

    picture = Image.new("RGB", (40, 30), (0, 0, 0))
    found = Detections(
        boxes=torch.tensor([[5.0, 5.0, 20.0, 20.0]]), scores=torch.tensor([0.9]), labels=torch.tensor([0]),
        category_ids=[7], class_names=["cat"], image_size=(30, 40),
    )  # fmt: skip
    drawn = found.draw(picture, width=1)
    assert drawn.size == picture.size and picture.getpixel((5, 12)) == (0, 0, 0)  # the input is not changed
    assert drawn.getpixel((5, 12)) == category_color(7)  # the box's left edge
    assert drawn.getpixel((35, 25)) == (0, 0, 0)  # outside the box
    picture.save(tmp_path / "p.png")
    array = np.array(picture)  # every input predict takes works alike: a file, an array, a tensor, BGR
    for alike in (found.draw(tmp_path / "p.png", width=1), found.draw(array, width=1),
                  found.draw(torch.from_numpy(array).permute(2, 0, 1), width=1),
                  found.draw(array[:, :, ::-1], width=1, channels="BGR")):  # fmt: skip
        assert np.array_equal(np.asarray(alike), np.asarray(drawn))
    with pytest.raises(detr_peg.errors.DataError, match="picture"):
        found.draw(np.zeros((30, 40), dtype=np.float64))
    # The boxes are in the pixels of the image predicted on: another size would put them elsewhere.
    with pytest.raises(detr_peg.errors.DataError) as err:
        found.draw(Image.new("RGB", (300, 200)))
    assert str(err.value) == (
        "picture is 300 x 200 pixels but the detections are of a 40 x 30 image; draw them on the image they were "
        "predicted on."
    )
    assert found.records(3)[0]["image_id"] == 3
    with pytest.raises(TypeError, match="image_id must be an integer"):
        found.records("a")


def test_a_detector_from_a_hub_folder_fine_tunes_from_its_weights(tiny_demo_dir, tmp_path) -> None:
    data = tiny_demo_dir / "data"
    torch.manual_seed(0)
    saved = detr_peg.Detector.from_config(None, [*TINY_MODEL, "model.num_classes=4"], device="cpu")
    saved.save_pretrained(tmp_path / "folder")
    read = detr_peg.Detector.from_pretrained(tmp_path / "folder", device="cpu")
    overrides = ["train.max_iters=1", "train.batch_size=2", "data.train_scales=[64]", "data.train_max_size=64",
                 "train.lr=0", "train.lr_backbone=0", "train.weight_decay=0"]  # fmt: skip
    tuned = read.fine_tune(
        tmp_path / "run", train_images=data / "train", train_annotations=data / "annotations_train.json",
        overrides=overrides,
    )  # fmt: skip
    assert tuned.config.train.init_from == str(tmp_path / "folder" / "model.safetensors")
    for key, value in saved.model.state_dict().items():  # learning rate 0: the folder's weights, unchanged
        if "running_" not in key and "num_batches" not in key:
            torch.testing.assert_close(tuned.model.state_dict()[key], value, msg=key)


def test_changing_the_config_it_returns_changes_no_detector(detector, tmp_path) -> None:
    """``config`` is a copy: a changed copy never reaches a saved folder that would not fit the weights."""
    queries = detector.config.model.num_queries
    changed = detector.config
    changed.model.num_queries, changed.model.position.name = queries + 5, "sine"
    assert detector.config.model.num_queries == queries and detector.config != changed
    names = detector.class_names
    detector.label_map.names[0] = "changed"
    assert detector.class_names == names and detector.label_map.names[0] == names[0]
    detector.save_pretrained(tmp_path / "hub")
    again = detr_peg.Detector.from_pretrained(tmp_path / "hub", device="cpu")
    assert again.config == detector.config and again.label_map == detector.label_map


def test_a_one_pixel_image_is_drawn_with_a_one_pixel_line() -> None:
    """The default width (2 px at least) was refused on a 1 x 1 image: predict stopped with a traceback."""
    detections = detr_peg.Detections(
        boxes=torch.tensor([[0.0, 0.0, 1.0, 1.0]]), scores=torch.tensor([0.9]), labels=torch.tensor([0]),
        category_ids=[1], class_names=["a"], image_size=(1, 1),
    )  # fmt: skip
    drawn = detections.draw(torch.zeros(3, 1, 1, dtype=torch.uint8))
    assert drawn.size == (1, 1) and drawn.getpixel((0, 0)) != (0, 0, 0)  # the box's colour on the one pixel


@pytest.mark.parametrize("width", [0, -1, True, 2.5, 10**6])
def test_drawing_refuses_a_line_width_that_is_no_width(width) -> None:
    detections = detr_peg.Detections(
        boxes=torch.tensor([[1.0, 1.0, 5.0, 5.0]]), scores=torch.tensor([0.9]), labels=torch.tensor([0]),
        category_ids=[1], class_names=["a"], image_size=(8, 10),
    )  # fmt: skip
    with pytest.raises(ValueError, match=rf"^width must be a whole number of pixels from 1 to 10, got {width!r}\.$"):
        detections.draw(torch.zeros(3, 8, 10, dtype=torch.uint8), width=width)
    with pytest.raises(ConfigError, match=r"^channels must be 'RGB' or 'BGR', got 'XYZ'\.$"):  # as predict's
        detections.draw(torch.zeros(3, 8, 10, dtype=torch.uint8), channels="XYZ")


def test_numpy_numbers_are_numbers(detector, tmp_path) -> None:
    """NumPy's scalars work wherever Python's numbers do, and what is written holds Python numbers."""
    image = np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    plain = detector.predict(image, threshold=0.0, batch_size=2)
    numpy = detector.predict(image, threshold=np.float32(0.0), batch_size=np.int64(2))
    _assert_same(plain, numpy)
    records = numpy.records(np.int64(3))
    assert records == plain.records(3) and type(records[0]["image_id"]) is int
    json.dumps(records)
    assert np.array_equal(np.asarray(numpy.draw(image, width=np.int32(2))), np.asarray(plain.draw(image, width=2)))
    from detr_peg.config.loader import config_with

    cfg = config_with(detector.config, {"train.max_iters": np.int64(7), "train.lr": np.float32(0.5)}, "a study")
    assert (cfg.train.max_iters, cfg.train.lr) == (7, 0.5)
    assert type(cfg.train.max_iters) is int and type(cfg.train.lr) is float


def test_detections_are_indexed_like_their_tensors() -> None:
    found = detr_peg.Detections(
        boxes=torch.tensor([[1.0, 1.0, 5.0, 5.0], [2.0, 2.0, 6.0, 6.0], [0.0, 0.0, 3.0, 3.0]]),
        scores=torch.tensor([0.9, 0.6, 0.2]), labels=torch.tensor([0, 1, 0]), category_ids=[1, 2, 1],
        class_names=["a", "b", "a"], image_size=(8, 10), source="x.jpg",
    )  # fmt: skip
    for index, rows in ((1, [1]), (np.int64(-1), [2]), (slice(None, None, 2), [0, 2]), ([2, 0], [2, 0]), ([], []),
                        (slice(None, None, -1), [2, 1, 0]), (found.scores.argmax(), [0]), (np.array(2), [2]),
                        (found.scores > 0.5, [0, 1]), (np.array([True, False, True]), [0, 2])):  # fmt: skip
        picked = found[index]
        torch.testing.assert_close(picked.boxes, found.boxes[rows].reshape(-1, 4))
        torch.testing.assert_close(picked.scores, found.scores[rows])
        torch.testing.assert_close(picked.labels, found.labels[rows])
        assert picked.category_ids == [found.category_ids[i] for i in rows]
        assert picked.class_names == [found.class_names[i] for i in rows]
        assert (picked.image_size, picked.source) == (found.image_size, found.source)
    with pytest.raises(IndexError):
        found[3]
    for bad in ("a", 1.5, True, None, [[0]], [0.5], torch.tensor(True), torch.tensor(0.5)):
        with pytest.raises(TypeError, match=r"^Detections are indexed by a position, a slice, positions or a bool"):
            found[bad]


def test_loading_a_checkpoint_leaves_the_callers_generator_alone(coco128_checkpoint) -> None:
    torch.manual_seed(0)
    expected = torch.rand(5)
    torch.manual_seed(0)
    detr_peg.Detector.from_checkpoint(coco128_checkpoint, device="cpu")
    torch.testing.assert_close(torch.rand(5), expected)


@pytest.mark.parametrize("device", [torch.device("meta"), torch.device("cpu", 1), torch.device("xpu")])
def test_a_device_object_is_checked_as_its_name_is(coco128_checkpoint, device) -> None:
    with pytest.raises(ConfigError, match=rf"^device is '{device}'; valid are 'auto', 'cpu', 'cuda' and 'cuda:N'\.$"):
        detr_peg.Detector.from_checkpoint(coco128_checkpoint, device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_device_object_without_cuda_is_one_sentence(coco128_checkpoint) -> None:
    with pytest.raises(ConfigError, match=r"^device is 'cuda' but CUDA is not available; use device=cpu\.$"):
        detr_peg.Detector.from_checkpoint(coco128_checkpoint, device=torch.device("cuda"))


@pytest.mark.parametrize(("named", "says"), [("cuda", "cpu"), ("cuda:1", "cpu"), ("cpu", "cpu"), ("auto", "auto")])
def test_the_config_names_the_device_the_detector_runs_on(coco128_checkpoint, named, says) -> None:
    loaded = detr_peg.Detector.from_checkpoint(coco128_checkpoint, device="cpu", overrides=[f"train.device={named}"])
    assert loaded.device == torch.device("cpu") and loaded.config.train.device == says


@pytest.mark.parametrize("cast", ["half", "bfloat16", "double", "meta"])
def test_a_model_cast_by_the_user_is_refused_in_one_sentence(coco128_checkpoint, tmp_path, cast) -> None:
    """predict, evaluate and export run float32 weights on the detector's device; another cast is named."""
    detector = detr_peg.Detector.from_checkpoint(coco128_checkpoint, device="cpu")
    {"half": lambda m: m.half(), "bfloat16": lambda m: m.to(torch.bfloat16), "double": lambda m: m.double(),
     "meta": lambda m: m.to("meta")}[cast](detector.model)  # fmt: skip
    for call in (lambda: detector.predict(torch.zeros(3, 32, 32, dtype=torch.uint8)),
                 lambda: detector.evaluate(tmp_path, tmp_path / "a.json"),
                 lambda: detector.export_onnx(tmp_path / "m.onnx")):  # fmt: skip
        with pytest.raises(ConfigError, match=r"^detector.model holds torch\.\w+ weights on \w+, but the detector runs "
                                              r"float32 on cpu .*: call detector\.model\.float\(\)\.to\(detector\.device\)\.$"):  # fmt: skip
            call()
    assert list(tmp_path.iterdir()) == []
    if cast != "meta":  # what the message says puts it right
        detector.model.float().to(detector.device)
        assert len(detector.predict(torch.zeros(3, 32, 32, dtype=torch.uint8), threshold=0.0)) > 0
