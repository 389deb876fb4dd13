"""The bounded-read layer on its own: sizes, kinds of file, nesting, alias expansion, integer range."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from detr_peg import bounded_read
from detr_peg.bounded_read import check_tree, load_yaml_text, read_bounded_bytes
from detr_peg.errors import DataError


def test_a_regular_file_within_its_limit_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_bytes(b'{"x": 1}')
    assert read_bounded_bytes(tmp_path / "a.json", "File", "config", DataError) == b'{"x": 1}'


def test_never_more_than_the_limit_is_read(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(bounded_read.LIMITS, "config", bounded_read.Limits(max_bytes=8))
    (tmp_path / "big.yaml").write_bytes(b"x" * 9)
    with pytest.raises(DataError, match="big.yaml is 9 bytes, more than the 8 bytes accepted for config files"):
        read_bounded_bytes(tmp_path / "big.yaml", "File", "config", DataError)


def test_a_small_file_is_read_under_a_memory_limit_below_its_kind_s_limit(tmp_path: Path) -> None:
    """read(n) reserves n bytes up front: asking for the 4 GiB limit of a 2-byte file failed under ``ulimit -v``."""
    import subprocess
    import sys

    (tmp_path / "a.json").write_bytes(b"{}")
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
        "from detr_peg.bounded_read import LIMITS, read_bounded_bytes; from detr_peg.errors import DataError; "
        "assert LIMITS['annotations'].max_bytes >= 2 << 30; "
        f"print(read_bounded_bytes({str(tmp_path / 'a.json')!r}, 'File', 'annotations', DataError))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (0, "b'{}'\n"), result.stderr


def test_a_file_that_grew_since_it_was_checked_is_refused(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a.json").write_bytes(b'{"x": 1}')
    monkeypatch.setattr(bounded_read, "check_regular_file", lambda *args: 2)  # the size when it was checked
    with pytest.raises(DataError, match=r"a.json grew while it was read, or is larger than the .* config files\.$"):
        read_bounded_bytes(tmp_path / "a.json", "File", "config", DataError)


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


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("n: 1{0}\n", "holds a number of 5,001 digits; refusing"),
        ("[-1{0}]\n", "holds a number of 5,002 digits; refusing"),
        ("n: 0x1{0}\n", "holds a larger integer, outside the signed 64-bit range"),
    ],
)
def test_an_integer_python_cannot_read_or_print_is_refused(text: str, words: str) -> None:
    with pytest.raises(DataError, match=f"big.yaml {words}"):
        load_yaml_text(text.format("9" * 5000), "big.yaml", "Config file", "config", DataError)


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


@pytest.mark.parametrize(
    "text, key, lines",
    [
        ("a: 1\nb: 2\na: 3\n", "'a'", (1, 3)),
        ("data:\n  x: 1\nmodel: {}\ndata:\n  y: 2\n", "'data'", (1, 4)),
        ("a:\n  b:\n    c: 1\n    d: 2\n    c: 3\n", "'c'", (3, 5)),
        ("- {k: 1, j: 2, k: 3}\n", "'k'", (1, 1)),
        ("1: a\n1: b\n", "1", (1, 2)),
        ("x: &a {p: 1}\ny:\n  <<: *a\n  q: 1\n  q: 2\n", "'q'", (4, 5)),
        ("'a': 1\na: 2\n", "'a'", (1, 2)),
    ],
    ids=["top", "two-sections", "deep", "flow-in-list", "number-key", "beside-a-merge", "quoted-and-plain"],
)
def test_a_key_given_twice_in_one_mapping_names_the_key_and_both_lines(text: str, key: str, lines) -> None:
    with pytest.raises(DataError) as info:
        load_yaml_text(text, "twice.yaml", "Config file", "config", DataError)
    message = str(info.value)
    assert message.startswith(f"Config file twice.yaml gives the key {key} twice in one mapping"), message
    assert f"(line {lines[0]} and line {lines[1]})" in message, message


def test_keys_brought_in_by_a_merge_may_be_overridden() -> None:
    data = load_yaml_text(
        "base: &b {lr: 1, wd: 2}\ntrain:\n  <<: *b\n  lr: 3\n", "m.yaml", "Config", "config", DataError
    )
    assert data["train"] == {"lr": 3, "wd": 2}


def test_keep_text_keeps_the_text_of_non_string_scalars() -> None:
    data = load_yaml_text(
        "d: 2001-12-14\nb: [yes, x, 0x1F]\nn: ~\n", "t.yaml", "Config", "config", DataError, keep_text=True
    )
    assert data["d"] == bounded_read.ScalarText(__import__("datetime").date(2001, 12, 14), "2001-12-14")
    assert data["b"] == [bounded_read.ScalarText(True, "yes"), "x", bounded_read.ScalarText(31, "0x1F")]
    assert data["n"] == bounded_read.ScalarText(None, "~")
    assert bounded_read.plain(data["b"]) == [True, "x", 31]
