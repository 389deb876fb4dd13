"""The end of a tool that computes one JSON report (``tools/box_scale.py``, ``tools/padding_residual.py``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from detr_peg.errors import UserError
from detr_peg.outputs import Output, describe_os_error, guard_outputs, write_json


def run_json_report(prog: str, compute: Callable[[], dict[str, Any]], output: Path | None) -> int:
    """Claim ``output`` (the rules of every command's outputs), run ``compute``, write and print its report;
    return 0, or 2 after one line on stderr for a ``UserError`` or a file ``OSError``.
    """
    try:
        with guard_outputs(prog, [], [Output(output, "--output")] if output is not None else []):
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
