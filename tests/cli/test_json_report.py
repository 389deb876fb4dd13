"""run_json_report: the shared end of the report tools (write, print, one-line errors, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

from detr_peg.cli.json_report import run_json_report
from detr_peg.errors import DataError


def test_the_report_is_printed_and_written(tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.json"
    assert run_json_report("tool.py", lambda: {"a": 1, "b": [0.5]}, out) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out) == json.loads(out.read_text()) == {"a": 1, "b": [0.5]} and printed.err == ""


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    def refuse() -> dict:
        raise DataError("--images x is not a folder.")

    assert run_json_report("tool.py", refuse, None) == 2
    printed = capsys.readouterr()
    assert (printed.out, printed.err) == ("", "tool.py: --images x is not a folder.\n")

    def unreadable() -> dict:
        return json.loads((tmp_path / "folder").read_text())

    (tmp_path / "folder").mkdir()
    assert run_json_report("tool.py", unreadable, None) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and len(printed.err.splitlines()) == 1
    assert printed.err.startswith("tool.py: ") and str(tmp_path / "folder") in printed.err


def test_the_output_follows_the_rules_of_every_command(tmp_path: Path, capsys) -> None:
    """A missing folder is created; a folder, or a file of the user's, is refused before the work."""
    ran = []
    missing = tmp_path / "no" / "report.json"
    assert run_json_report("tool.py", lambda: ran.append(1) or {"a": 1}, missing) == 0
    assert ran == [1] and json.loads(missing.read_text()) == {"a": 1}
    capsys.readouterr()
    (tmp_path / "folder").mkdir()
    assert run_json_report("tool.py", lambda: ran.append(2) or {}, tmp_path / "folder") == 2
    assert ran == [1] and capsys.readouterr().err == (
        f"tool.py: --output {tmp_path / 'folder'} is a folder; give a file name.\n"
    )
    mine = tmp_path / "mine.json"
    mine.write_text("my notes")
    assert run_json_report("tool.py", lambda: ran.append(3) or {}, mine) == 2
    assert ran == [1] and mine.read_text() == "my notes"
    assert "mine.json exists and was not written by detr-peg" in capsys.readouterr().err
