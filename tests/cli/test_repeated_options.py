"""Every option of every command that takes a value may be given once (the parser class of all commands)."""

from __future__ import annotations

import argparse

import pytest

from detr_peg.cli.main import available_commands, command_parser

CANDIDATES = ("1", "0.5", "1,2", "cpu", "17", "64", "x.yaml", "64x64", "a.b=c,d")


def _value_options() -> list[tuple[str, str, list[str]]]:
    """(command, option, one valid value's words) for every option that stores a value."""
    found = []
    for name in available_commands():
        parser, _ = command_parser(name)
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or isinstance(action, argparse._AppendAction):
                continue
            if action.choices:
                word = str(next(iter(action.choices)))
            else:
                word = next(c for c in CANDIDATES if _accepts(action, c))
            count = action.nargs if isinstance(action.nargs, int) else 1
            found.append((name, action.option_strings[-1], [word] * count))
    return found


def _accepts(action: argparse.Action, word: str) -> bool:
    try:
        (action.type or str)(word)
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False
    return True


OPTIONS = _value_options()


def test_every_command_has_value_options() -> None:
    assert {name for name, _, _ in OPTIONS} >= {"train", "eval", "predict", "export", "study"}


@pytest.mark.parametrize("command, option, words", OPTIONS, ids=[f"{c}{o}" for c, o, _ in OPTIONS])
def test_an_option_given_twice_is_one_line(command: str, option: str, words: list[str], capsys) -> None:
    parser, _ = command_parser(command)
    try:  # once is fine (a missing required argument aside)
        parser.parse_known_args([option, *words])
    except SystemExit:
        pass
    assert "given twice" not in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_known_args([option, *words, option, *words])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"option {option} is given twice" in err, err
