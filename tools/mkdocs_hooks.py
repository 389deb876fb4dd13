"""MkDocs hooks: each command's ``--help`` in the pages, and the docstrings' Sphinx roles as plain code.

* ``<!-- detr-peg-help: COMMAND -->`` in a page becomes that command's ``--help``
  text (an empty COMMAND gives ``detr-peg --help``). The parsers are built
  in-process from :mod:`detr_peg.cli.main`, so the reference always shows the
  options of the code being documented.
* The docstrings name other objects with Sphinx roles (``:class:`~a.b.C```),
  which the API reference would show as written: they become code (``C``).
"""

from __future__ import annotations

import os
import re

HELP = re.compile(r"<!-- detr-peg-help: *([\w-]*) *-->")
ROLE = re.compile(r":(?:class|meth|func|mod|attr|exc|data|obj):\s*<code>(~?)([^<]*)</code>")


def _help_text(command: str) -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps at this width
    from detr_peg.cli.main import command_parser, top_parser

    parser = command_parser(command)[0] if command else top_parser()
    return parser.format_help().rstrip()


def on_page_markdown(markdown: str, **kwargs: object) -> str:
    return HELP.sub(lambda m: f"```text\n{_help_text(m.group(1))}\n```", markdown)


def _code(match: re.Match) -> str:
    short, name = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if short else name}</code>"


def on_page_content(html: str, **kwargs: object) -> str:
    return ROLE.sub(_code, html)
