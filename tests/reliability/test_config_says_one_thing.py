"""A config says one thing: what could be read two ways is refused in one line, or read as written.

The rules, each one mechanism:

* a key given twice in one YAML mapping, at any depth (two ``data:``
  sections, ``lr`` twice, a flow mapping, a ``_base_`` file, a study file, an
  override's YAML value) is refused by the one YAML reader
  (:func:`detr_peg.bounded_read.load_yaml_text`), naming the file,
  both lines and the key; keys brought in by a ``<<`` merge may be overridden;
* an option that takes a value given twice (``--config a.yaml --config
  b.yaml``) is refused by the parser class of every command;
* an override key or a file key with an empty part (``model..arch``,
  ``.train.lr``, ``train.lr.``) is named as such;
* an empty list where one item at least is needed (field metadata
  ``non_empty``) is refused instead of meaning the default;
* a string field takes what YAML would read as a date, number, bool or null
  as the text the user wrote (``train.output_dir=2001-12-14``).

Refusals run one ``detr-peg`` command on a copy of an earlier run and check
exit status 2, one stderr line with the fragments, and every earlier output
byte-identical (see ``conftest.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import yaml

from detr_peg.config.loader import PAIRED_KEYS
from tests.reliability.conftest import OUT, RESUME, assert_one_line_error, assert_outputs_kept, assert_success, snapshot

EVAL = ["eval", "--checkpoint", OUT / "checkpoint.pth", "--output", OUT]
PREDICT = ["predict", "--checkpoint", OUT / "checkpoint.pth", "data/images", "--output", "pred"]


def _files(**texts: str) -> Callable[[Path], None]:
    """Write ``name_yaml="..."`` as ``name.yaml`` in the case folder."""

    def prepare(case: Path) -> None:
        for name, text in texts.items():
            (case / name.replace("_yaml", ".yaml")).write_text(text)

    return prepare


MY = [*RESUME, "--config", "my.yaml"]

CASES: list[tuple[str, Sequence, Sequence[str], Callable[[Path], None] | None]] = [
    # a key twice in one YAML mapping: the examples of the rule
    (
        "same-key-twice",
        MY,
        ["my.yaml gives the key 'lr' twice in one mapping (line 2 and line 3)"],
        _files(my_yaml="train:\n  lr: 1.0e-4\n  lr: 2.0e-4\n"),
    ),
    (
        "two-data-sections",
        MY,
        ["my.yaml gives the key 'data' twice in one mapping (line 1 and line 4)"],
        _files(my_yaml="data:\n  hflip_prob: 0.1\nloss: {}\ndata:\n  crop_prob: 0.2\n"),
    ),
    # more members of the class
    (
        "twice-deep-down",
        MY,
        ["my.yaml gives the key 'dropout' twice in one mapping (line 3 and line 5)"],
        _files(my_yaml="model:\n  transformer:\n    dropout: 0.1\n    nheads: 2\n    dropout: 0.0\n"),
    ),
    (
        "twice-in-a-flow-mapping",
        MY,
        ["my.yaml gives the key 'lr' twice in one mapping (line 1 and line 1)"],
        _files(my_yaml="train: {lr: 1.0e-4, lr: 2.0e-4}\n"),
    ),
    (
        "twice-in-a-base-file",
        MY,
        ["base.yaml gives the key 'seed' twice in one mapping (line 2 and line 4)"],
        _files(my_yaml="_base_: base.yaml\n", base_yaml="train:\n  seed: 1\n  lr: 1.0e-4\n  seed: 2\n"),
    ),
    (
        "twice-in-an-override-value",
        [*RESUME, "model.transformer={dropout: 0.1, dropout: 0.2}"],
        ["override model.transformer gives the key 'dropout' twice in one mapping"],
        None,
    ),
    (
        "twice-in-a-study-file",
        ["study", "--study", "study.yaml", "--output", "st"],
        ["study.yaml gives the key 'seeds' twice in one mapping (line 1 and line 3)"],
        _files(study_yaml="seeds: 1\nconfigs: [my.yaml]\nseeds: 2\n", my_yaml="{}\n"),
    ),
    # an option given twice, in every command
    (
        "config-twice",
        [*RESUME, "--config", "a.yaml", "--config", "b.yaml"],
        ["option --config is given twice (a.yaml, then b.yaml); give it once"],
        _files(a_yaml="{}\n", b_yaml="{}\n"),
    ),
    ("train-output-twice", [*RESUME, "--output", "x", "--output", "y"], ["option --output is given twice"], None),
    (
        "eval-checkpoint-twice",
        [*EVAL, "--checkpoint", OUT / "checkpoint.pth"],
        ["option --checkpoint is given twice"],
        None,
    ),
    (
        "predict-threshold-twice",
        [*PREDICT, "--score-threshold", "0.3", "--score-threshold", "0.5"],
        ["option --score-threshold is given twice (0.3, then 0.5)"],
        None,
    ),
    # an empty part in a key
    ("double-dot", [*RESUME, "model..arch=detr"], ["'model..arch' (it has two dots in a row)"], None),
    ("leading-dot", [*RESUME, ".train.lr="], ["'.train.lr' (it starts with a dot)"], None),
    ("trailing-dot", [*RESUME, "train.lr.="], ["'train.lr.' (it ends with a dot)"], None),
    ("only-dots", [*RESUME, "..=1"], ["override '..=1' has an empty part in its key"], None),
    ("blank-part", [*RESUME, "train. .lr=1"], ["has an empty part in its key 'train. .lr'"], None),
    (
        "empty-key-in-a-file",
        MY,
        ["my.yaml: key '' under 'train' has an empty name"],
        _files(my_yaml="train:\n  '': 1\n"),
    ),
    ("dotted-empty-in-a-file", MY, ["my.yaml: key 'lr.' under 'train'"], _files(my_yaml="train:\n  lr.: 1\n")),
    # an empty list where an item is needed
    (
        "no-backbone-stage",
        [*RESUME, "model.backbone.out_stages=[]"],
        ["'model.backbone.out_stages' must hold at least one item, got [] (leave it unset or null for the default)"],
        None,
    ),
    ("no-train-scale", [*RESUME, "data.train_scales=[]"], ["'data.train_scales' must hold at least one item"], None),
    ("no-crop-size", [*RESUME, "data.crop_size=[]"], ["'data.crop_size' must hold at least one item"], None),
    ("no-crop-scale", [*RESUME, "data.crop_scales=[]"], ["'data.crop_scales' must hold at least one item"], None),
    # a list whose order means something
    (
        "stages-descending",
        [*RESUME, "model.backbone.out_stages=[3,2]"],
        ["'model.backbone.out_stages' must be ascending without repeats, got [3, 2]"],
        None,
    ),
    (
        "detr-with-three-stages",
        [*RESUME, "model.backbone.out_stages=[1,2,3]"],
        ["model.backbone.out_stages is [1, 2, 3], but DETR takes one stage; give one, such as [3]"],
        None,
    ),
    (
        "crop-size-one-side",
        [*RESUME, "data.crop_size=[384]"],
        ["'data.crop_size' must be [min, max] with min <= max, got [384]"],
        None,
    ),
    (
        "peg-without-layers",
        [*RESUME, "model.position.name=peg", "model.position.peg_layers=[]"],
        ["'model.position.peg_layers' must hold at least one item"],
        None,
    ),
    (
        "empty-list-in-a-file",
        MY,
        ["my.yaml: 'model.position.peg_layers' must hold at least one item, got []"],
        _files(my_yaml="model:\n  position:\n    name: peg\n    peg_layers: []\n"),
    ),
]


@pytest.mark.parametrize("args, fragments, prepare", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_config_that_says_two_things_is_one_clear_line(cli, case: Path, args, fragments, prepare) -> None:
    if prepare is not None:
        prepare(case)
    before = snapshot(case / OUT)
    result = cli.run(args, cwd=case)
    assert_one_line_error(result, *fragments)
    assert_outputs_kept(before, case / OUT)
    assert not (case / "st").exists() and not (case / "pred").exists()


#: (key, text as written): values that YAML reads as a date, bool, number or null, given to string fields.
AS_WRITTEN = [
    ("train.output_dir", "2001-12-14"),
    ("train.output_dir", "2001-12-14 21:59:43.10"),
    ("train.output_dir", "yes"),
    ("train.output_dir", "off"),
    ("train.output_dir", "1e3"),
    ("train.output_dir", "0x1F"),
    ("train.output_dir", "012"),
    ("train.output_dir", "3.50"),
    ("data.train_images", "2020-01-01"),
    ("model.backbone.weights", "on"),
]


#: The other key of a pair that goes together (``data.train_images`` and ``data.train_annotations``).
PARTNER = {key: other for pair in PAIRED_KEYS for key, other in (pair, pair[::-1])}


@pytest.mark.parametrize("in_file", [False, True], ids=["override", "config-file"])
def test_a_string_field_takes_the_text_as_written(cli, tmp_path: Path, in_file: bool) -> None:
    """``--print-config`` resolves the config as training would; each string field holds the exact text."""
    for key, text in AS_WRITTEN:
        partner = [f"{PARTNER[key]}=partner.json"] if key in PARTNER else []
        section, _, name = key.rpartition(".")
        if in_file:
            nested = f"{name}: {text}\n"
            for part in reversed(section.split(".")):
                nested = f"{part}:\n" + "".join(f"  {line}\n" for line in nested.splitlines())
            (tmp_path / "my.yaml").write_text(nested)
            args = ["train", "--print-config", "--config", "my.yaml", *partner]
        else:
            args = ["train", "--print-config", f"{key}={text}", *partner]
        result = cli.run(args, cwd=tmp_path)
        assert_success(result)
        resolved = yaml.safe_load(result.stdout)
        for part in key.split("."):
            resolved = resolved[part]
        assert resolved == text, f"{key}={text} became {resolved!r}"


def test_null_still_means_unset_for_an_optional_string(cli, tmp_path: Path) -> None:
    result = cli.run(["train", "--print-config", "model.backbone.weights=null", "data.train_images=~"], cwd=tmp_path)
    assert_success(result)
    resolved = yaml.safe_load(result.stdout)
    assert resolved["model"]["backbone"]["weights"] is None and resolved["data"]["train_images"] is None
