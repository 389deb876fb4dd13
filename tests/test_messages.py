"""How messages show long values and lists (``detr_peg.messages``), and that errors naming one stay one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from detr_peg.errors import ConfigError
from detr_peg.lab.study.grid import StudyDefinition, expand_cells, parse_axis
from detr_peg.messages import listed, shortened
from detr_peg.outputs import write_error


@pytest.mark.parametrize(
    ("text", "limit", "shown"),
    [
        ("short", 60, "short"),
        ("x" * 60, 60, "x" * 60),
        ("a" * 30 + "b" * 31, 60, "a" * 30 + "b" * 31),  # shortened it would be longer
        ("a" * 50 + "b" * 50, 60, "a" * 30 + "..." + "b" * 30 + " (100 characters)"),
        ("0123456789" * 10, 20, "0123456789...0123456789 (100 characters)"),
        ("abc", 1, "abc"),
        ("abcdefghijklmnopqrstuvwxyz", 1, "a...z (26 characters)"),
    ],
)
def test_shortened_keeps_start_and_end_and_says_the_length(text: str, limit: int, shown: str) -> None:
    assert shortened(text, limit) == shown


@pytest.mark.parametrize(
    ("items", "limit", "shown"),
    [
        ([], 3, ""),
        (["a"], 3, "a"),
        (["a", "b", "c"], 3, "a, b, c"),
        (["a", "b", "c", "d"], 3, "a, b, c, ..."),
        ((1, 2), 1, "1, ..."),
    ],
)
def test_listed_names_the_first_items(items, limit: int, shown: str) -> None:
    assert listed(items, limit) == shown
    assert listed(iter(items), limit) == shown  # any iterable, read once


def test_a_write_error_on_a_long_path_names_its_start_and_end(tmp_path: Path) -> None:
    path = tmp_path / ("d" * 200) / "checkpoint.pth"
    message = str(write_error(path, PermissionError(13, "Permission denied", str(path))))
    assert message.startswith(f"Could not write {str(path)[:60]}...") and "checkpoint.pth (" in message
    assert f"({len(str(path))} characters): Permission denied" in message and "\n" not in message


def test_a_cell_of_a_long_value_is_named_by_both_ends() -> None:
    value = "a" * 150 + "z" * 150
    with pytest.raises(ConfigError) as info:
        expand_cells(StudyDefinition(configs=("c.yaml",), axes=(parse_axis(f"data.val_images={value}"),)))
    assert f"with data.val_images={'a' * 20}...{'z' * 20} (300 characters) would be the folder " in str(info.value)
