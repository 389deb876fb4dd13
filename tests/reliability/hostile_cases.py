"""One hostile input per case, checked the same way for every class of the reliability rules.

A :class:`Hostile` case prepares a copy of the case folder (see
``conftest.py``), runs one ``detr-peg`` command in its own process and
:func:`check_refused` asserts:

* exit status 2, exactly one non-empty line on stderr naming every
  fragment, no traceback;
* every file of the case folder byte-identical and nothing added (inputs
  and the earlier run alike; ``metrics.jsonl`` keeps its earlier records), or, for a case that must write elsewhere
  (``kept="out"``), the earlier run's folder ``out/``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tests.cli_process import CliRunner
from tests.reliability.conftest import OUT, assert_one_line_error, assert_outputs_kept, snapshot


@dataclass
class Hostile:
    """One hostile input.

    Attributes:
        name: the test id.
        args: the command line (paths relative to the case folder); a
            callable gets the case folder (for absolute paths).
        fragments: what the error line must contain.
        prepare: makes the case folder hostile.
        kept: ``"all"``: the whole case folder stays byte-identical;
            ``"out"``: the earlier run's folder does.
    """

    name: str
    args: Sequence | Callable[[Path], Sequence]
    fragments: Sequence[str]
    prepare: Callable[[Path], None] | None = None
    kept: Literal["all", "out"] = "all"


def _snapshot_case(case: Path) -> dict[str, bytes]:
    """Every regular file under ``case`` (special files and link loops are named, not read)."""
    out = {}
    for path in sorted(case.rglob("*")):
        if path.is_symlink() or not path.is_file():
            out[str(path.relative_to(case))] = b"<special>"
        else:
            out[str(path.relative_to(case))] = path.read_bytes()
    return out


def check_refused(cli: CliRunner, case: Path, spec: Hostile) -> str:
    """Run ``spec`` in ``case`` and assert the rule (see the module docstring); returns the error line."""
    if spec.prepare is not None:
        spec.prepare(case)
    before = _snapshot_case(case) if spec.kept == "all" else snapshot(case / OUT)
    args = spec.args(case) if callable(spec.args) else spec.args
    result = cli.run(args, cwd=case)
    line = assert_one_line_error(result, *spec.fragments)
    if spec.kept == "all":
        after = _snapshot_case(case)
        assert sorted(after) == sorted(before), f"files added or removed: {sorted(set(after) ^ set(before))}"
        # A resumed run appends to its log before it meets a bad image; the earlier records stay.
        changed = [
            name
            for name in before
            if before[name] != after[name]
            and not (name.endswith("metrics.jsonl") and after[name].startswith(before[name]))
        ]
        assert not changed, f"changed: {changed}"
    else:
        assert_outputs_kept(before, case / OUT)
    return line


def ids(cases: Sequence[Hostile]) -> list[str]:
    return [c.name for c in cases]
