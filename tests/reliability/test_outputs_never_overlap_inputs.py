"""Class 1: no command writes to one of its inputs, or over a file detr-peg did not write.

Every case declares an output that aliases an input (the same path spelled
otherwise, a symbolic or hard link, a folder inside an input folder, a file
the command writes into its output folder that is an input) or that holds a
file of the user's. Each is refused up front with one line, and the whole
case folder (inputs and the earlier run) stays byte-identical. The rule and
its mechanism: :mod:`detr_peg.outputs`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from detr_peg.cli.main import COMMANDS
from tests.conftest import REPO_ROOT
from tests.reliability.conftest import ANNOTATIONS, BASE, IMAGES, OUT, RESUME, assert_success, draw_image
from tests.reliability.hostile_cases import Hostile, check_refused, ids

CKPT = str(OUT / "checkpoint.pth")
NEW_RUN = ["train", *BASE, "train.epochs=1"]
NEW_RUN_NO_OUTPUT = [arg for arg in NEW_RUN if not str(arg).startswith("train.output_dir=")]


def _symlink(link: str, target: str):
    def prepare(case: Path) -> None:
        (case / link).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(case / target, (case / link).parent), case / link)

    return prepare


def _hardlink(link: str, target: str):
    def prepare(case: Path) -> None:
        os.link(case / target, case / link)

    return prepare


def _copy(target: str, source: str = str(ANNOTATIONS)):
    def prepare(case: Path) -> None:
        (case / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(case / source, case / target)

    return prepare


def _user_file(relative: str, content: bytes = b"my own notes\n"):
    def prepare(case: Path) -> None:
        (case / relative).parent.mkdir(parents=True, exist_ok=True)
        (case / relative).write_bytes(content)

    return prepare


def _png_next_to_output(case: Path) -> None:
    from PIL import Image

    (case / "pics").mkdir()
    Image.fromarray(draw_image(3, [], [])).save(case / "pics" / "a.png")


def _study_base(case: Path) -> None:
    (case / "base.yaml").write_text("model:\n  arch: detr\n")


STUDY = ["study", "--config", "base.yaml", "--grid", "model.position.name=sine,peg"]


CASES = [
    Hostile(
        "configs-copy-onto-the-shipped-config",
        ["configs", "copy", "demo", str(REPO_ROOT / "configs" / "demo.yaml")],
        ["demo.yaml already exists and is not overwritten"],
    ),
    Hostile("convert-onto-its-source", ["convert", CKPT, CKPT], ["DST out/checkpoint.pth is the same file as SRC"]),
    Hostile(
        "convert-onto-its-source-spelled-otherwise",
        ["convert", CKPT, "out/../out/./checkpoint.pth"],
        ["is the same file as SRC out/checkpoint.pth"],
    ),
    Hostile(
        "convert-onto-a-symlink-of-its-source",
        ["convert", CKPT, "link.pth"],
        ["DST link.pth is the same file as SRC"],
        _symlink("link.pth", CKPT),
    ),
    Hostile(
        "convert-onto-a-hard-link-of-its-source",
        ["convert", CKPT, "hard.pth"],
        ["DST hard.pth is the same file as SRC"],
        _hardlink("hard.pth", CKPT),
    ),
    Hostile(
        "convert-onto-its-config",
        ["convert", CKPT, "my.yaml", "--config", "my.yaml"],
        ["DST my.yaml is the same file as --config my.yaml"],
        _user_file("my.yaml", b"{}\n"),
    ),
    Hostile(
        "convert-onto-a-file-of-the-user",
        ["convert", CKPT, "mine.pth"],
        ["mine.pth exists and was not written by detr-peg", "choose another DST"],
        _user_file("mine.pth"),
    ),
    Hostile(
        "convert-onto-a-training-checkpoint",
        ["convert", "other.pth", CKPT],
        ["out/checkpoint.pth exists and was written by detr-peg train, not convert"],
        _copy("other.pth", CKPT),
    ),
    Hostile(
        "predict-into-its-input-folder",
        ["predict", "--checkpoint", CKPT, IMAGES, "--output", IMAGES],
        ["--output data/images is INPUT data/images, a folder it reads"],
    ),
    Hostile(
        "predict-into-a-folder-inside-its-input",
        ["predict", "--checkpoint", CKPT, "data", "--output", "data/images/pred"],
        ["--output data/images/pred is inside INPUT data"],
    ),
    Hostile(
        "predict-png-over-its-input-image",
        ["predict", "--checkpoint", CKPT, "pics/a.png", "--output", "pics"],
        ["--output pics (its a.png) is the same file as INPUT pics/a.png"],
        _png_next_to_output,
    ),
    Hostile(
        "predict-over-a-predictions-file-of-the-user",
        ["predict", "--checkpoint", CKPT, IMAGES, "--output", "mine"],
        ["mine/predictions.json exists and was not written by detr-peg"],
        _user_file("mine/predictions.json", b"[]\n"),
    ),
    Hostile(
        "predict-over-a-symlink-to-the-annotations",
        ["predict", "--checkpoint", CKPT, IMAGES, "--output", "linked"],
        ["linked/predictions.json exists and was not written by detr-peg"],
        _symlink("linked/predictions.json", str(ANNOTATIONS)),
    ),
    Hostile(
        "train-into-its-image-folder",
        [*NEW_RUN, f"train.output_dir={IMAGES}"],
        ["train.output_dir data/images is data.train_images data/images, a folder it reads"],
    ),
    Hostile(
        "train-metrics-over-its-annotations",
        [*NEW_RUN, "train.output_dir=val", "data.val_annotations=val/metrics.json"],
        ["train.output_dir val (its metrics.json) is the same file as data.val_annotations val/metrics.json"],
        _copy("val/metrics.json"),
    ),
    Hostile(
        "train-checkpoint-over-its-init-weights",
        [*NEW_RUN, "train.output_dir=warm", "train.init_from=warm/checkpoint.pth"],
        ["train.output_dir warm (its checkpoint.pth) is the same file as train.init_from"],
        _copy("warm/checkpoint.pth", CKPT),
    ),
    Hostile(
        "train-output-is-a-file",
        [*NEW_RUN_NO_OUTPUT, "--output", "afile"],
        ["--output afile is a file, not a folder"],
        _user_file("afile"),
    ),
    Hostile(
        "eval-detections-over-its-annotations",
        ["eval", "--checkpoint", CKPT, "--output", "data", "data.val_annotations=data/detections.json"],
        ["--output data (its detections.json) is the same file as data.val_annotations"],
        _copy("data/detections.json"),
    ),
    Hostile(
        "eval-metrics-over-its-config",
        ["eval", "--checkpoint", CKPT, "--config", "cfg/metrics.json", "--output", "cfg"],
        ["--output cfg (its metrics.json) is the same file as --config cfg/metrics.json"],
        _user_file("cfg/metrics.json", b"{}\n"),
    ),
    Hostile(
        "eval-into-its-image-folder",
        ["eval", "--checkpoint", CKPT, "--output", "data/images/eval"],
        ["--output data/images/eval is inside data.val_images data/images"],
    ),
    Hostile(
        "demo-over-annotations-of-the-user",
        ["demo", "--output", "mydemo", "--num-train", "2"],
        ["mydemo/data/annotations_train.json exists and was not written by detr-peg"],
        _copy("mydemo/data/annotations_train.json"),
    ),
    Hostile(
        "demo-over-an-image-folder-of-the-user",
        ["demo", "--output", "data/..", "--num-train", "2"],
        ["exists and was not written by detr-peg"],
        _user_file("run/keep.txt"),
    ),
    Hostile(
        "export-onto-its-checkpoint",
        ["export", "--checkpoint", CKPT, "--output", "out/./checkpoint.pth"],
        ["--output out/checkpoint.pth is the same file as --checkpoint out/checkpoint.pth"],
    ),
    Hostile(
        "export-onto-a-hard-link-of-its-checkpoint",
        ["export", "--checkpoint", CKPT, "--output", "model.onnx"],
        ["--output model.onnx is the same file as --checkpoint"],
        _hardlink("model.onnx", CKPT),
    ),
    Hostile(
        "export-onto-a-file-of-the-user",
        ["export", "--checkpoint", CKPT, "--output", "model.onnx"],
        ["model.onnx exists and was not written by detr-peg", "choose another --output"],
        _user_file("model.onnx"),
    ),
    Hostile(
        "export-onto-the-run-metrics",
        ["export", "--checkpoint", CKPT, "--output", "out/metrics.json"],
        ["out/metrics.json exists and was written by detr-peg train, not export"],
    ),
    Hostile(
        "study-over-a-table-of-the-user",
        [*STUDY, "--output", "mine"],
        ["mine/study.md exists and was not written by detr-peg", "choose another --output"],
        lambda case: (_study_base(case), _user_file("mine/study.md")(case)),
    ),
    Hostile(
        "study-output-is-its-config",
        [*STUDY, "--output", "base.yaml"],
        ["--output base.yaml is a file, not a folder"],
        _study_base,
    ),
    Hostile(
        "study-into-a-folder-of-cells-of-the-user",
        [*STUDY, "--output", "exp"],
        ["exp/cells exists and was not written by detr-peg"],
        lambda case: (_study_base(case), _user_file("exp/cells/notes.txt")(case)),
    ),
    Hostile(
        "plot-over-a-figure-of-the-user",
        ["plot", "out"],
        ["out/plots/learning_curve.png exists and was not written by detr-peg"],
        _user_file("out/plots/learning_curve.png", b"my picture"),
    ),
    Hostile(
        "bench-report-over-its-config",
        ["bench", "--config", "my.yaml", "--output", "my.yaml"],
        ["--output my.yaml is the same file as --config my.yaml"],
        _user_file("my.yaml", b"model:\n  arch: detr\n"),
    ),
    Hostile(
        "bench-report-over-a-file-of-the-user",
        ["bench", "--output", "report.json"],
        ["report.json exists and was not written by detr-peg"],
        _user_file("report.json", b"{}"),
    ),
    Hostile(
        "eval-scales-over-a-report-of-the-user",
        ["eval", "--checkpoint", CKPT, "--output", "ev", "--scales", "1,2"],
        ["ev/scales_resized.json exists and was not written by detr-peg"],
        _user_file("ev/scales_resized.json", b"{}"),
    ),
    Hostile(
        "predict-onnx-into-its-graph",
        ["predict", "--onnx", "m.onnx", IMAGES, "--output", "m.onnx"],
        ["--output m.onnx is a file, not a folder"],
        _user_file("m.onnx", b"not a graph"),
    ),
]

# An empty output name would be the current folder: refused for every command that takes one, nothing created.
EMPTY = {
    "train": [*NEW_RUN_NO_OUTPUT, "--output", ""],
    "predict": ["predict", "--checkpoint", CKPT, IMAGES, "--output", ""],
    "eval": ["eval", "--checkpoint", CKPT, "--output", ""],
    "export": ["export", "--checkpoint", CKPT, "--output", ""],
    "convert": ["convert", CKPT, ""],
    "demo": ["demo", "--output", " ", "--num-train", "2"],
    "study": [*STUDY, "--output", ""],
    "bench": ["bench", "--output", ""],
}
CASES += [Hostile(f"{name}-into-an-empty-name", args, ["--output is empty" if name != "convert" else "dst is empty"], _study_base)
          for name, args in EMPTY.items()]  # fmt: skip
CASES.append(Hostile(
    "train-into-new-nested-folders-with-a-data-error",
    [*NEW_RUN_NO_OUTPUT, "--output", "a/b/c", "data.train_images=none"],
    ["data.train_images none does not exist (a relative path is read from the current folder, "],
))  # fmt: skip


def test_every_command_has_overlap_cases() -> None:
    """A new command that writes files must come with its cases here (and its declaration in declared_io)."""
    assert {spec.args[0] for spec in CASES} == set(COMMANDS)


@pytest.mark.parametrize("spec", CASES, ids=ids(CASES))
def test_an_output_overlapping_an_input_is_refused_up_front(cli, case: Path, spec: Hostile) -> None:
    check_refused(cli, case, spec)


def test_a_command_replaces_what_it_wrote_itself(cli, case: Path) -> None:
    """The same prediction twice into one folder: the second run replaces the first run's files."""
    args = ["predict", "--checkpoint", CKPT, IMAGES, "--output", "again"]
    assert_success(cli.run(args, cwd=case))
    first = (case / "again" / "predictions.json").read_bytes()
    (case / "again" / "keep.txt").write_text("mine")  # a file of the user's beside them is left alone
    assert_success(cli.run(args, cwd=case))
    assert (case / "again" / "predictions.json").read_bytes() == first
    assert (case / "again" / "keep.txt").read_text() == "mine"


def test_resume_adopts_a_run_folder_written_before_ownership_was_recorded(cli, case: Path) -> None:
    (case / OUT / ".detr-peg-outputs.json").unlink()
    check_refused(
        cli, case, Hostile("without-resume", NEW_RUN, ["out/checkpoint.pth exists and was not written by detr-peg"])
    )
    assert_success(cli.run(RESUME, cwd=case))
    assert '"checkpoint.pth": "train"' in (case / OUT / ".detr-peg-outputs.json").read_text()
