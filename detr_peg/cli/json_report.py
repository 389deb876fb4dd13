"""The end of a command-line tool that computes one JSON report: check, compute, write, print.

``tools/box_scale.py`` and ``tools/padding_residual.py`` end alike: they
compute a JSON object, write it to ``--output`` when given, and print it.
:func:`run_json_report` does that once for both, with the rule of every
command: bad input (a :class:`~detr_peg.errors.UserError`, or a file the
system would not let the tool read or write) is one line on stderr,
``<prog>: <message>``, and exit status 2; ``--output`` is checked before
the work starts, as every command checks its outputs
(:func:`~detr_peg.guards.output_guard.check_writable`: its folder exists and
takes a file, and it is not a folder), so a mistyped path costs nothing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from detr_peg.errors import UserError
from detr_peg.fileio.atomic import write_json
from detr_peg.fileio.os_errors import describe_os_error
from detr_peg.guards.output_guard import Output, check_writable


def run_json_report(prog: str, compute: Callable[[], dict[str, Any]], output: Path | None) -> int:
    """Run ``compute``, write its report to ``output`` (when not None) and print it; returns the exit status.

    Args:
        prog: the tool's name, which starts each error line.
        compute: makes the report (plain JSON values); raises ``UserError`` on bad input.
        output: the file to write the report to, or None.

    Returns:
        0, or 2 after one line on stderr.
    """
    try:
        if output is not None:
            check_writable(prog, [Output(output, "--output")])
        report = compute()
        if output is not None:
            write_json(output, report)
    except UserError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file or folder the system would not let the tool read or write
        print(f"{prog}: {describe_os_error(exc)}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1))
    return 0
