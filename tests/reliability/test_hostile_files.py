"""Class 4: hostile or odd files are bounded before use and named precisely when refused.

Every file detr-peg reads goes through :mod:`detr_peg.bounded_read`:
config YAML, COCO JSON, checkpoints and images. Each case makes one of them
hostile (nested YAML aliases, very deep JSON, integers beyond 64 bits, files
that are not UTF-8, very long names, FIFOs, devices, link loops, images of
extreme shape) and must get one line naming the file and what is wrong with
it, with the whole case folder byte-identical.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO_ROOT
from tests.reliability.conftest import ANNOTATIONS, BASE, IMAGES, OUT, RESUME, edit_annotations
from tests.reliability.hostile_cases import Hostile, check_refused, ids

CKPT = str(OUT / "checkpoint.pth")
ANN = str(ANNOTATIONS)
IMG2 = str(IMAGES / "img2.jpg")
EVAL = ["eval", "--checkpoint", CKPT, "--output", OUT]
#: A new run into new folders: one that fails before its first checkpoint leaves nothing behind.
NEW_RUN = ["train", *(a for a in BASE if not a.startswith("train.output_dir=")), "train.output_dir=fresh/run"]
LONG_NAME = "a" * 300 + ".json"

BILLION_LAUGHS = (
    "\n".join(
        ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
    )
    + "\n"
)


#: A shipped proxy config; its dataset (outputs/proxy_data/data) does not exist in a case folder.
PROXY = str(REPO_ROOT / "configs" / "proxy" / "detr_small.yaml")


def _write(relative: str, content: bytes | str):
    def prepare(case: Path) -> None:
        path = case / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()
        path.write_bytes(content.encode() if isinstance(content, str) else content)

    return prepare


def _fifo(relative: str):
    def prepare(case: Path) -> None:
        path = case / relative
        if path.exists():
            path.unlink()
        os.mkfifo(path)

    return prepare


def _link_loop(relative: str):
    def prepare(case: Path) -> None:
        path = case / relative
        if path.exists():
            path.unlink()
        os.symlink(path.name, path)

    return prepare


def _dangling(relative: str):
    def prepare(case: Path) -> None:
        path = case / relative
        if path.exists():
            path.unlink()
        os.symlink("gone.json", path)

    return prepare


def _link_to_nothing(relative: str):
    def prepare(case: Path) -> None:
        os.symlink("gone", case / relative)

    return prepare


def _thin_image(annotated: bool):
    def prepare(case: Path) -> None:
        """img2 replaced by a 1-pixel-high strip of 400 pixels, annotated as such or without a size."""
        Image.fromarray(np.full((1, 400, 3), 128, np.uint8)).save(case / IMAGES / "img2.jpg")
        sized = {"width": 400, "height": 1} if annotated else {}
        edit_annotations(
            lambda d: (d["images"][2].pop("width"), d["images"][2].pop("height"), d["images"][2].update(sized))
        )(case)

    return prepare


def _nested_json(depth: int) -> str:
    return '{"images": ' + "[" * depth + "]" * depth + ', "annotations": [], "categories": []}'


def _huge_id(case: Path) -> None:
    edit_annotations(
        lambda d: (
            d["images"][0].update(id=2**70),
            [a.update(image_id=2**70) for a in d["annotations"] if a["image_id"] == 1],
        )
    )(case)


def _many_digits(case: Path) -> None:
    text = (case / ANNOTATIONS).read_text().replace('"id": 1,', '"id": ' + "9" * 5000 + ",", 1)
    (case / ANNOTATIONS).write_text(text)


CASES = [
    # config YAML
    Hostile(
        "yaml-billion-laughs",
        [*RESUME, "--config", "bomb.yaml"],
        ["bomb.yaml", "aliases"],
        _write("bomb.yaml", BILLION_LAUGHS),
    ),
    Hostile(
        "yaml-nested-deeply",
        [*RESUME, "--config", "deep.yaml"],
        ["deep.yaml", "nested"],
        _write("deep.yaml", "train: " + "[" * 5000 + "]" * 5000 + "\n"),
    ),
    Hostile(
        "yaml-nested-past-the-limit",
        [*RESUME, "--config", "deep.yaml"],
        ["deep.yaml", "nested more than 16"],
        _write("deep.yaml", "train: " + "[" * 40 + "]" * 40 + "\n"),
    ),
    Hostile(
        "yaml-latin-1",
        [*RESUME, "--config", "latin.yaml"],
        ["latin.yaml", "is not UTF-8"],
        _write("latin.yaml", "# caf\xe9\ntrain:\n  lr: 1.0e-4\n".encode("latin-1")),
    ),
    Hostile(
        "yaml-utf-16",
        [*RESUME, "--config", "wide.yaml"],
        ["wide.yaml", "is not UTF-8"],
        _write("wide.yaml", "train:\n  lr: 1.0e-4\n".encode("utf-16")),
    ),
    Hostile(
        "yaml-integer-beyond-64-bits",
        [*RESUME, "--config", "seed.yaml"],
        ["seed.yaml", "outside the signed 64-bit range"],
        _write("seed.yaml", "train:\n  seed: " + "9" * 25 + "\n"),
    ),
    Hostile(
        "yaml-oversized",
        [*RESUME, "--config", "big.yaml"],
        ["big.yaml", "more than the 1.0 MiB accepted"],
        _write("big.yaml", "# padding\n" * 120_000),
    ),
    Hostile("yaml-is-a-fifo", [*RESUME, "--config", "pipe.yaml"], ["pipe.yaml", "is a FIFO"], _fifo("pipe.yaml")),
    Hostile("yaml-is-a-device", [*RESUME, "--config", "/dev/zero"], ["/dev/zero", "is a device"]),
    Hostile("yaml-is-a-proc-file", [*RESUME, "--config", "/proc/self/status"], ["says it is empty but holds data"]),
    Hostile(
        "yaml-link-loop",
        [*RESUME, "--config", "loop.yaml"],
        ["loop.yaml", "refers to itself in a loop"],
        _link_loop("loop.yaml"),
    ),
    Hostile(
        "yaml-dangling-link",
        [*RESUME, "--config", "gone.yaml"],
        ["gone.yaml is a symbolic link to gone.json, which does not exist"],
        _dangling("gone.yaml"),
    ),
    Hostile("yaml-is-a-folder", [*RESUME, "--config", "data"], ["Config file data is a folder"]),
    Hostile(
        "override-integer-beyond-64-bits",
        [*RESUME, "train.seed=" + "9" * 30],
        ["train.seed", "outside the signed 64-bit range"],
    ),
    # COCO JSON
    Hostile("json-nested-beyond-the-parser", RESUME, [ANN, "nested too deeply"], _write(ANN, _nested_json(200_000))),
    Hostile("json-nested-past-the-limit", RESUME, [ANN, "nested more than 16 levels"], _write(ANN, _nested_json(30))),
    Hostile("json-image-id-beyond-64-bits", RESUME, [ANN, "1180591620717411303424", "signed 64-bit"], _huge_id),
    Hostile("json-id-of-5000-digits", RESUME, [ANN, "holds a value that cannot be read"], _many_digits),
    Hostile("json-is-a-fifo", RESUME, [ANN, "is a FIFO"], _fifo(ANN)),
    Hostile("json-link-loop", RESUME, [ANN, "refers to itself in a loop"], _link_loop(ANN)),
    Hostile(
        "json-name-too-long",
        [*RESUME, f"data.train_annotations=data/{LONG_NAME}"],
        [LONG_NAME, "has a name longer than the file system allows"],
    ),
    Hostile(
        "json-under-a-file",
        [*RESUME, f"data.train_annotations={ANN}/x.json"],
        [f"{ANN}/x.json does not exist ({ANN} is a file, not a folder)"],
    ),
    Hostile(
        "json-under-a-link-to-nothing",
        [*RESUME, "data.train_annotations=unmounted/annotations.json"],
        ["unmounted/annotations.json does not exist (unmounted is a symbolic link to gone, which does not exist)"],
        _link_to_nothing("unmounted"),
    ),
    Hostile(
        "json-latin-1",
        RESUME,
        [ANN, "is not UTF-8"],
        _write(ANN, '{"images": [], "note": "caf\xe9"}'.encode("latin-1")),
    ),
    # images
    Hostile(
        "image-extreme-aspect-ratio", RESUME, [IMG2, "400 x 1 pixels", "aspect ratio above 100"], _thin_image(False)
    ),
    Hostile(
        "image-extreme-aspect-ratio-in-the-annotations",
        RESUME,  # refused before any training
        ["has image id 3 with file_name 'img2.jpg', which is 400 x 1 pixels", "on_bad_sample=skip"],
        _thin_image(True),
    ),
    Hostile("image-is-a-fifo", RESUME, [IMG2, "is a FIFO"], _fifo(IMG2)),
    *(
        Hostile(f"new-run-stopped-by-an-image-{kind}", NEW_RUN, [IMG2, words], prepare)  # its new folders removed
        for kind, words, prepare in [
            ("fifo", "is a FIFO", _fifo(IMG2)),
            ("truncated", "cannot be decoded", lambda c: _write(IMG2, (c / IMG2).read_bytes()[:300])(c)),
        ]
    ),  # fmt: skip
    Hostile("image-link-loop", EVAL, [IMG2, "refers to itself in a loop"], _link_loop(IMG2)),
    Hostile(
        "image-is-a-folder",
        RESUME,
        [IMG2, "is a folder"],
        lambda c: ((c / IMAGES / "img2.jpg").unlink(), (c / IMAGES / "img2.jpg").mkdir()),
    ),
    Hostile(
        "predict-image-link-loop",
        ["predict", "--checkpoint", CKPT, "loop.jpg", "--output", OUT / "predictions"],
        ["loop.jpg", "refers to itself in a loop"],
        _link_loop("loop.jpg"),
    ),
    *(
        Hostile(
            f"predict-a-folder-holding-{kind}",
            ["predict", "--checkpoint", CKPT, IMAGES, "--output", "pred"],
            [f"{IMAGES}/zz.png", words],
            prepare,
        )  # an image name in a folder is an image: refused, never skipped
        for kind, words, prepare in [
            ("a-dangling-link", "which does not exist", _link_to_nothing(f"{IMAGES}/zz.png")),
            ("a-link-loop", "refers to itself in a loop", _link_loop(f"{IMAGES}/zz.png")),
            ("a-fifo", "is a FIFO", _fifo(f"{IMAGES}/zz.png")),
        ]
    ),  # fmt: skip
    *(
        Hostile(
            f"predict-onnx-{kind}",
            ["predict", "--onnx", "m.onnx", IMAGES, "--output", "pred"],
            ["m.onnx is not an ONNX model onnxruntime can load"],
            _write("m.onnx", content),
        )
        for kind, content in [
            ("empty", b""),
            ("two-bytes", b"\x08\x07"),
            ("text", "not a graph\n"),
            ("a-checkpoint-header", b"PK\x03\x04" + bytes(60)),
        ]
    ),  # fmt: skip
    # checkpoints
    Hostile(
        "checkpoint-is-a-fifo",
        ["eval", "--checkpoint", "pipe.pth", "--output", OUT],
        ["pipe.pth", "is a FIFO"],
        _fifo("pipe.pth"),
    ),
    Hostile(
        "checkpoint-is-a-device", ["eval", "--checkpoint", "/dev/zero", "--output", OUT], ["/dev/zero", "is a device"]
    ),
    Hostile("checkpoint-is-a-folder", ["eval", "--checkpoint", "data", "--output", OUT], ["data is a folder"]),
    Hostile(
        "init-from-link-loop",
        ["train", *RESUME[2:], "train.output_dir=new", "train.resume=false", "train.init_from=loop.pth"],
        ["loop.pth", "refers to itself in a loop"],
        _link_loop("loop.pth"),
    ),
    # study files: the rule of config files
    Hostile(
        "study-file-latin-1",
        ["study", "--study", "s.yaml", "--output", "st"],
        ["Study file s.yaml is not UTF-8"],
        _write("s.yaml", "# caf\xe9\nseeds: 1\n".encode("latin-1")),
    ),
    Hostile(
        "study-file-billion-laughs",
        ["study", "--study", "bomb.yaml", "--output", "st"],
        ["bomb.yaml", "aliases"],
        _write("bomb.yaml", BILLION_LAUGHS),
    ),
    Hostile(
        "study-file-is-a-checkpoint",
        ["study", "--study", CKPT, "--output", "st"],
        ["Study file out/checkpoint.pth is", "more than the 1.0 MiB accepted for config files"],
    ),
    Hostile("study-file-is-a-device", ["study", "--study", "/dev/zero", "--output", "st"], ["/dev/zero is a device"]),
    Hostile(
        "study-file-link-loop",
        ["study", "--study", "loop.yaml", "--output", "st"],
        ["loop.yaml", "refers to itself in a loop"],
        _link_loop("loop.yaml"),
    ),
    # study files: every field of the eval and cluster sections is checked before anything runs
    Hostile(
        "study-scales-are-text",
        ["study", "--study", "s.yaml", "--output", "st"],
        ["s.yaml: 'eval.scales' must be a list of positive numbers", "got 'abc'"],
        _write("s.yaml", f"configs: [{PROXY}]\neval: {{scales: abc}}\n"),
    ),
    Hostile(
        "study-canvas-scale-infinite",
        ["study", "--study", "s.yaml", "--output", "st"],
        ["'eval.canvas_scales' must be a list of positive numbers", "got [1.5, inf]"],
        _write("s.yaml", f"configs: [{PROXY}]\neval: {{canvas_scales: [1.5, .inf]}}\n"),
    ),
    Hostile(
        "study-scale-twice",
        ["study", "--study", "s.yaml", "--output", "st"],
        ["'eval.scales' must be a list of positive numbers such as [1, 1.5, 2], each once", "got [1, 1.5, 1.0]"],
        _write("s.yaml", f"configs: [{PROXY}]\neval: {{scales: [1, 1.5, 1.0]}}\n"),
    ),
    Hostile(
        "study-scale-twice-on-the-command-line",
        ["study", "--config", PROXY, "--output", "st", "--canvas-scales", "2,2"],
        ["argument --canvas-scales: gives the scale 2 twice ('2,2'); give each scale once"],
    ),
    Hostile(
        "study-padding-is-a-word",
        ["study", "--study", "s.yaml", "--output", "st"],
        ["'eval.padding' must be true or false, got 'maybe'"],
        _write("s.yaml", f"configs: [{PROXY}]\neval: {{padding: maybe}}\n"),
    ),
    Hostile(
        "study-nodes-are-text",
        ["study", "--study", "s.yaml", "--output", "st", "--submitit-local"],
        ["'cluster.nodes' must be a whole number of at least 1, got 'two'"],
        _write("s.yaml", f"configs: [{PROXY}]\ncluster: {{nodes: two}}\n"),
    ),
    Hostile(
        "study-of-a-million-cells",
        [
            "study",
            "--config",
            PROXY,
            "--grid",
            "model.num_queries=5,6,7,8,9,10,11,12,13,14",
            "--seeds",
            "100000",
            "--output",
            "st",
        ],
        ["has 1,000,000 cells", "more than the 10,000 accepted"],
    ),
    Hostile(
        "study-scale-beyond-the-largest-image",
        ["study", "--config", PROXY, "--scales", "1,500", "--output", "st"],
        [f"{PROXY}: --scales 500 gives images of up to 48,000 px", "more than the 8192 px accepted"],
    ),
    Hostile(
        "study-dataset-not-generated",
        ["study", "--config", PROXY, "--output", "st"],
        [f"{PROXY}: data.train_images is outputs/proxy_data/data/train, which is not an existing folder"],
    ),
]


@pytest.mark.parametrize("spec", CASES, ids=ids(CASES))
def test_a_hostile_file_is_refused_with_one_precise_line(cli, case: Path, spec: Hostile) -> None:
    check_refused(cli, case, spec)


def test_exif_orientation_is_not_applied_by_any_command(cli, case: Path) -> None:
    """A JPEG stored 64 x 48 whose EXIF says "rotate 90°": train, eval and predict all see the stored 64 x 48 grid."""
    from tests.reliability.conftest import assert_success

    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: the camera was turned; viewers show it rotated
    picture = Image.open(case / IMAGES / "img2.jpg")
    picture.load()
    picture.save(case / IMAGES / "img2.jpg", exif=exif.tobytes())
    assert Image.open(case / IMAGES / "img2.jpg").getexif()[0x0112] == 6
    assert_success(cli.run(RESUME, cwd=case))  # the annotation says 64 x 48: no size mismatch
    assert_success(cli.run(["predict", "--checkpoint", CKPT, IMAGES / "img2.jpg", "--output", "pred"], cwd=case))
    assert Image.open(case / "pred" / "img2.png").size[0] / Image.open(case / "pred" / "img2.png").size[1] == 64 / 48
