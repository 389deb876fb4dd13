"""Class 6: the command line itself. Overrides anywhere, one type per kind of option, errors in the user's words.

* ``key=value`` overrides (and ``predict``'s image paths) work before,
  between and after options, so the examples in ``--help`` run as printed;
* every numeric option is parsed by one type of its kind
  (:mod:`detr_peg.cli.option_types`): ``nan`` and ``inf`` are refused by every
  command, with the range in the message;
* every usage error is one line with exit status 2, and an error about a
  setting names the option the user typed (``--device``, ``--output``), not
  the config key behind it (:mod:`detr_peg.cli.main`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from detr_peg.cli import option_types
from tests.reliability.conftest import ANNOTATIONS, BASE, IMAGES, OUT, RESUME, assert_success
from tests.reliability.hostile_cases import Hostile, check_refused, ids

CKPT = str(OUT / "checkpoint.pth")
PREDICT = ["predict", "--checkpoint", CKPT, IMAGES, "--output", "pred"]
BASE_NO_OUTPUT = [arg for arg in BASE if not str(arg).startswith("train.output_dir=")]


def _file(relative: str):
    def prepare(case: Path) -> None:
        (case / relative).write_text("mine\n")

    return prepare


CASES = [
    Hostile(
        "threshold-nan",
        [*PREDICT, "--score-threshold", "nan"],
        [
            "detr-peg predict: error: argument --score-threshold: must be a number from 0 to 1, got 'nan'",
            "(see detr-peg predict --help)",
        ],
    ),
    Hostile("threshold-inf", [*PREDICT, "--score-threshold", "inf"], ["--score-threshold", "got 'inf'"]),
    Hostile("threshold-above-one", [*PREDICT, "--score-threshold", "1.5"], ["--score-threshold", "got '1.5'"]),
    Hostile("threshold-negative", [*PREDICT, "--score-threshold", "-0.1"], ["--score-threshold", "got '-0.1'"]),
    Hostile(
        "threshold-missing-value",
        [*PREDICT, "--score-threshold"],
        ["argument --score-threshold: expected one argument"],
    ),
    Hostile(
        "batch-size-zero",
        [*PREDICT, "--batch-size", "0"],
        ["argument --batch-size: must be a whole number of at least 1, got '0'"],
    ),
    Hostile("batch-size-fraction", [*PREDICT, "--batch-size", "2.5"], ["--batch-size", "got '2.5'"]),
    Hostile(
        "bench-threads-beyond-any-machine",
        ["bench", "--threads", "100000"],
        ["argument --threads: must be a whole number from 1 to 1024, got '100000'"],
    ),  # fmt: skip
    Hostile("device-unknown", [*PREDICT, "--device", "gpu"], ["argument --device: must be one of", "got 'gpu'"]),
    Hostile(
        "bench-device-unknown",
        ["bench", "--config", "demo", "--device", "gpu"],
        ["detr-peg bench: error: argument --device: must be one of 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'"],
    ),
    Hostile(
        "demo-negative-count",
        ["demo", "--output", "d", "--num-train", "-5"],
        ["argument --num-train: must be a whole number from 1 to 100000, got '-5'"],
    ),
    Hostile("demo-pictures-nan", ["demo", "--output", "d", "--pictures", "nan"], ["argument --pictures", "'nan'"]),
    Hostile("misspelt-option", [*RESUME, "--outptu", "x"], ["detr-peg train: error: unrecognized arguments: --outptu"]),
    Hostile(
        "missing-required-option", ["eval", "--output", OUT], ["the following arguments are required: --checkpoint"]
    ),
    Hostile(
        "stray-word-after-an-option",
        ["train", "--resume", *BASE_NO_OUTPUT, "train.epochs=2", "--output", "out", "foo"],
        ["override 'foo' is not of the form key=value"],
    ),
    Hostile(
        "bad-override-after-an-option",
        ["train", *BASE, "--resume", "train.epochs=2", "train.batch_size=two"],
        ["'train.batch_size' must be an integer", "'two'"],
    ),
    Hostile(
        "output-folder-under-a-file",
        ["train", *BASE_NO_OUTPUT, "train.epochs=1", "--output", "afile/run"],
        ["Could not write into --output afile/run: afile is a file, not a folder; choose another path"],
        _file("afile"),
    ),
    # options pasted from a page that typeset '--' as a dash
    Hostile("em-dash-option", ["train", "\u2014config", "demo", *RESUME[1:]], ["'\u2014config' starts with em dash"]),
    Hostile("en-dash-option", [*PREDICT, "\u2013output", "x"], ["'\u2013output' starts with en dash, not '--'"]),
    Hostile("minus-sign-option", ["eval", "\u2212\u2212checkpoint", CKPT], ["starts with minus sign, not '--'"]),
    Hostile("demo-too-many-images", ["demo", "--num-train", "99999999"], ["argument --num-train:", "got '99999999'"]),
    Hostile(
        "bench-output-is-a-folder-name",
        ["bench", "--config", "demo", "--modes", "infer", "--output", "bdir/"],
        ["--output bdir/ ends in a slash, which names a folder, but bench writes one file"],
    ),
    Hostile(
        "export-output-is-a-folder-name",
        ["export", "--checkpoint", CKPT, "--output", "mdir/"],
        ["--output mdir/ ends in a slash, which names a folder, but export writes one file"],
    ),
    Hostile(
        "output-tilde-after-equals",
        [*PREDICT[:-2], "--output=~/pred"],
        ["--output ~/pred: detr-peg does not expand '~' (a shell does, at the start of a word); write /"],
    ),
    Hostile(
        "input-tilde-after-equals",
        ["eval", "--checkpoint=~/run/checkpoint.pth", "--output", "e"],
        [
            "~/run/checkpoint.pth does not exist (detr-peg does not expand '~' (a shell does, at the start of a word); write /"
        ],
    ),
    Hostile(
        "data-tilde-in-an-override",
        ["train", *BASE, "train.output_dir=new", "data.train_images=~/coco/images"],
        ["data.train_images ~/coco/images does not exist (detr-peg does not expand '~'"],
    ),
    Hostile(
        "abbreviated-option",
        ["export", "--check", CKPT, "--output", "m.onnx"],
        ["detr-peg export: error: --check is not an option; options are written in full: --checkpoint"],
    ),
    Hostile(
        "dashed-name-after-the-separator",
        ["predict", "--checkpoint", CKPT, "--output", "pred", "--", "--nope.png"],
        ["detr-peg predict: error: Input --nope.png does not exist."],
    ),
    Hostile(
        "abbreviated-option-with-value", [*PREDICT, "--score=0.3"], ["--score is not an option", "--score-threshold"]
    ),
    Hostile(
        "batch-size-with-equals-sign",
        [*PREDICT, "--batch-size=abc"],
        ["argument --batch-size: must be a whole number of at least 1, got 'abc'"],
    ),
]


@pytest.mark.parametrize("spec", CASES, ids=ids(CASES))
def test_a_bad_command_line_is_one_line_naming_the_option(cli, case: Path, spec: Hostile) -> None:
    line = check_refused(cli, case, spec)
    if "--output" in line:
        assert "train.output_dir" not in line, line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize(
    "command", [PREDICT, ["bench", "--config", "demo", "--modes", "infer"]], ids=["predict", "bench"]
)
def test_a_device_error_names_the_option_given(cli, case: Path, command: list) -> None:
    line = check_refused(cli, case, Hostile("device-cuda", [*command, "--device", "cuda"], []))
    assert "--device is 'cuda' but CUDA is not available; use --device cpu" in line, line
    assert "train.device" not in line, line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_amp_error_names_the_option_given(cli, case: Path) -> None:
    line = check_refused(cli, case, Hostile("amp-fp16", ["bench", "--config", "demo", "--amp", "fp16"], []))
    assert "--amp fp16 needs a CUDA device; on the CPU use --amp bf16 or auto." in line, line


def test_the_predict_help_example_runs_as_printed(cli, case: Path) -> None:
    """``--help``: ``predict --checkpoint C a.jpg b.jpg --score-threshold 0.3 data.val_scale=512`` (smaller here)."""
    result = cli.run(
        [
            "predict",
            "--checkpoint",
            CKPT,
            IMAGES / "img0.jpg",
            IMAGES / "img1.jpg",
            "--score-threshold",
            "0.0",
            "data.val_scale=48",
            "--output",
            "pred",
            "eval.batch_size=1",
        ],
        cwd=case,
    )
    assert_success(result)
    records = json.loads((case / "pred" / "predictions.json").read_text())
    assert {r["file_name"] for r in records} == {"data/images/img0.jpg", "data/images/img1.jpg"}


def test_an_image_given_twice_is_predicted_once(cli, case: Path) -> None:
    """A file, the same file again through a link, and the folder holding both: each image once, in input order."""
    (case / "again.jpg").symlink_to((case / IMAGES / "img1.jpg").resolve())
    words = ["predict", "--checkpoint", CKPT, IMAGES / "img1.jpg", "again.jpg", IMAGES, "--score-threshold", "0"]
    result = cli.run([*words, "--output", "pred", "data.val_scale=48"], cwd=case)
    assert_success(result)
    records = json.loads((case / "pred" / "predictions.json").read_text())
    names = list(dict.fromkeys(r["file_name"] for r in records))
    folder = sorted(f"{IMAGES.as_posix()}/{p.name}" for p in (case / IMAGES).iterdir())
    assert names == [f"{IMAGES.as_posix()}/img1.jpg", *(n for n in folder if not n.endswith("/img1.jpg"))]
    assert sorted(p.name for p in (case / "pred").glob("*.png")) == sorted(
        n.rsplit("/", 1)[1].replace(".jpg", ".png") for n in folder
    )


def test_predict_says_when_a_checkpoint_names_no_categories(cli, case: Path) -> None:
    from detr_peg.checkpoint.format import read_checkpoint, save_checkpoint

    trained = read_checkpoint(case / CKPT)
    save_checkpoint(case / "unnamed.pth", trained.config, trained.model, None)
    result = cli.run(["predict", "--checkpoint", "unnamed.pth", IMAGES, "--output", "pred", "--score-threshold", "0"],
                     cwd=case)  # fmt: skip
    assert_success(result)
    assert "Note: unnamed.pth holds no label map, so category_id is the model's class index" in result.stdout
    records = json.loads((case / "pred" / "predictions.json").read_text())
    assert records and all(r["category_name"] == f"class {r['category_id']}" for r in records)


def test_overrides_before_between_and_after_options(cli, case: Path) -> None:
    data = json.loads((case / ANNOTATIONS).read_text())
    data["images"] = data["images"][:2]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] <= 2]
    (case / "two.json").write_text(json.dumps(data))
    result = cli.run(
        [
            "eval",
            "eval.batch_size=2",
            "--checkpoint",
            CKPT,
            "data.val_scale=48",
            "--output",
            "ev",
            "data.val_annotations=two.json",
        ],
        cwd=case,
    )
    assert_success(result)
    metrics = json.loads((case / "ev" / "metrics.json").read_text())
    assert metrics["num_images"] == 2 and metrics["annotations"] == "two.json"  # the last override was applied


def _options_of_every_command(typed: bool = True):
    """(command, argparse action) for every option of every command; only the typed ones when ``typed``."""
    from detr_peg.cli.main import available_commands, command_parser

    for name in available_commands():
        command, _ = command_parser(name)
        for action in command._actions:  # the test inspects argparse's actions; the package never does
            if action.option_strings and (action.type is not None or not typed):
                yield name, action


def test_every_typed_option_of_every_command_is_parsed_by_a_shared_type() -> None:
    """The rule of the class holds for options no case above lists: no bare ``int`` or ``float`` anywhere."""
    shared = {"integer", "number", "scale_list", "device", "config_file", "image_size", "key_values"}
    loose = [
        f"{name} {action.option_strings[0]} ({getattr(action.type, '__name__', action.type)})"
        for name, action in _options_of_every_command()
        if getattr(action.type, "__name__", None) not in shared or action.type.__module__ != option_types.__name__
    ]
    assert not loose, f"options with their own parser: {loose}"
    devices = [f"{name} {action.option_strings[0]}" for name, action in _options_of_every_command(typed=False)
               if action.dest == "device"]  # fmt: skip
    untyped = [f"{name} {action.option_strings[0]}" for name, action in _options_of_every_command(typed=False)
               if action.dest == "device" and action.type is not option_types.device]  # fmt: skip
    assert len(devices) >= 2 and not untyped, f"device options without option_types.device: {untyped}"


@pytest.mark.parametrize("text", ["nan", "inf", "-1", "1e99", "0x10", "", "2,5"])
def test_every_typed_option_refuses_non_numbers_and_out_of_range_values(text: str) -> None:
    """Each numeric option of each command refuses non-finite, negative, huge or malformed text, stating its range."""
    checked = []
    for name, action in _options_of_every_command():
        if action.type.__name__ in ("device", "config_file"):  # a device name, a path or config name: not numbers
            continue
        if action.type.__name__ == "scale_list" and text in ("1e99", "2,5"):
            continue  # a valid list; the largest scale depends on the dataset (checked before the first evaluation)
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            action.type(text)
        assert str(refused.value).startswith("must be ") and repr(text) in str(refused.value)
        checked.append(f"{name} {action.option_strings[0]}")
    assert len(checked) >= 15, checked


@pytest.mark.parametrize("text", ["1,,2", ",1", "1,2,", " , "])
def test_a_scale_list_with_an_empty_part_is_refused(text: str) -> None:
    """``--scales 1,,2`` is a typo, not two scales: refused with the accepted form, as any other malformed list."""
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        option_types.scale_list(text)
    assert str(refused.value) == f"must be comma-separated positive numbers such as 1,1.5,2, got {text!r}"
    assert option_types.scale_list(" 1, 1.5 ,2") == [1.0, 1.5, 2.0]
