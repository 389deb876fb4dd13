"""The bounded-read layer on its own: sizes, kinds of file, nesting, alias expansion, integer range."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from detr_peg.errors import DataError
from detr_peg.fileio import bounded_read
from detr_peg.fileio.bounded_read import check_tree, load_yaml_text, read_bounded_bytes


def test_a_regular_file_within_its_limit_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_bytes(b'{"x": 1}')
    assert read_bounded_bytes(tmp_path / "a.json", "File", "config", DataError) == b'{"x": 1}'


def test_never_more_than_the_limit_is_read(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(bounded_read.LIMITS, "config", bounded_read.Limits(max_bytes=8))
    (tmp_path / "big.yaml").write_bytes(b"x" * 9)
    with pytest.raises(DataError, match="big.yaml is 9 bytes, more than the 8 bytes accepted for a config file"):
        read_bounded_bytes(tmp_path / "big.yaml", "File", "config", DataError)


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.mkdir(), "is a folder"),
        (lambda p: os.mkfifo(p), r"is a FIFO \(named pipe\)"),
        (lambda p: os.symlink(p.name, p), "refers to itself in a loop"),
        (lambda p: os.symlink("elsewhere", p), "is a symbolic link to elsewhere, which does not exist"),
    ],
)
def test_each_kind_of_unreadable_path_is_named(tmp_path: Path, make, words: str) -> None:
    path = tmp_path / "thing"
    make(path)
    with pytest.raises(DataError, match=words):
        read_bounded_bytes(path, "File", "config", DataError)


def test_billion_laughs_is_refused_while_parsing() -> None:
    text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(9)
    )
    with pytest.raises(DataError, match=r"bomb.yaml expands to more than 100000 values \(nested YAML aliases"):
        load_yaml_text(text, "bomb.yaml", "Config file", "config", DataError)


def test_the_number_of_alias_uses_is_bounded() -> None:
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * 1001) + "]\n"
    with pytest.raises(DataError, match="uses more than 1000 YAML aliases"):
        load_yaml_text(text, "many.yaml", "Config file", "config", DataError)


def test_a_few_aliases_are_fine_but_their_expansion_counts() -> None:
    data = load_yaml_text("a: &a [1, 2]\nb: *a\n", "ok.yaml", "Config file", "config", DataError)
    assert data == {"a": [1, 2], "b": [1, 2]}
    shared = [list(range(1000))] * 200  # 200 references to one list: 200,000 values once expanded
    with pytest.raises(DataError, match="expands to more than 100000 values"):
        check_tree({"k": shared}, "x.yaml", "Config file", "config", DataError)


@pytest.mark.parametrize("value, ok", [(2**63 - 1, True), (-(2**63), True), (2**63, False), (-(2**63) - 1, False)])
def test_integers_must_fit_64_bits(value: int, ok: bool) -> None:
    if ok:
        assert check_tree({"id": value}, "a.json", "Annotation file", "annotations", DataError) == {"id": value}
    else:
        with pytest.raises(DataError, match="outside the signed 64-bit range"):
            check_tree({"id": value}, "a.json", "Annotation file", "annotations", DataError)


def test_nesting_is_bounded() -> None:
    deep: list = []
    for _ in range(20):
        deep = [deep]
    with pytest.raises(DataError, match="nested more than 16 levels"):
        check_tree(deep, "a.json", "Annotation file", "annotations", DataError)


def test_invalid_yaml_is_left_to_the_caller_with_its_line() -> None:
    with pytest.raises(yaml.YAMLError):
        load_yaml_text("a: [1, 2\n", "bad.yaml", "Config file", "config", DataError)
