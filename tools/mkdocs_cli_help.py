"""MkDocs hook: replaces ``<!-- detr-peg-help: COMMAND -->`` with that command's ``--help`` text.

An empty COMMAND gives the top-level ``detr-peg --help``. The parsers are built
in-process from :mod:`detr_peg.cli.main`, so the reference page always shows the
options of the code being documented.
"""

from __future__ import annotations

import os
import re

MARKER = re.compile(r"<!-- detr-peg-help: *([\w-]*) *-->")


def _help_text(command: str) -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps at this width
    from detr_peg.cli.main import command_parser, top_parser

    parser = command_parser(command)[0] if command else top_parser()
    return parser.format_help().rstrip()


def on_page_markdown(markdown: str, **kwargs: object) -> str:
    return MARKER.sub(lambda m: f"```text\n{_help_text(m.group(1))}\n```", markdown)
