"""How ``detr-peg`` reads its command line: one parser class, overrides anywhere, errors in the user's words.

Three rules hold for every command:

* **one line per error**: :class:`OneLineParser` reports a usage error as
  ``detr-peg <command>: error: <message> (see detr-peg <command> --help)``
  on one line with exit status 2, like every other user error;
* **``key=value`` anywhere**: :func:`parse_command_line` accepts config
  overrides (and, for ``predict``, image paths) before, between and after
  options; argparse stops collecting a positional list at the first
  option, and the words it leaves over are appended to the command's list
  (its ``POSITIONAL_DEST``, ``overrides`` by default);
* **the option the user typed**: a command maps its options to the config
  keys they set (``OPTION_KEYS``, e.g. ``{"--device": "train.device"}``);
  :func:`in_users_words` rewrites an error about such a key to name the
  option instead, when the user gave the option and not the key.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        hint = f" (see {self.prog} --help)" if " " in self.prog else ""
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")


def parse_command_line(
    parser: argparse.ArgumentParser, modules: dict[str, object], argv: Sequence[str] | None
) -> argparse.Namespace:
    """Parse ``argv``; leftover words join the command's positional list (see the module docstring)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        module = modules[args.command]
        dest = getattr(module, "POSITIONAL_DEST", "overrides")
        options = [word for word in extra if word.startswith("-")]
        if options or not hasattr(args, dest):
            command_parser = _command_parser(parser, args.command)
            command_parser.error(f"unrecognized arguments: {' '.join(options or extra)}")
        getattr(args, dest).extend(extra)
    return args


def _command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:  # argparse exposes subparsers only through its actions
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    return parser


def in_users_words(message: str, module: object, argv: Sequence[str]) -> str:
    """``message`` with config keys replaced by the options that set them, where the user typed the option."""
    typed = {word.split("=", 1)[0] for word in argv if word.startswith("--")}
    given_keys = {word.split("=", 1)[0] for word in argv if "=" in word and not word.startswith("-")}
    for option, key in getattr(module, "OPTION_KEYS", {}).items():
        if option in typed and key not in given_keys:
            message = re.sub(rf"(?<![\w.]){re.escape(key)}=", f"{option} ", message)
            message = re.sub(rf"(?<![\w.]){re.escape(key)}(?![\w])", option, message)
    return message


def command_argv(argv: Sequence[str] | None) -> list[str]:
    """The words of the command line (``sys.argv[1:]`` when ``argv`` is None)."""
    return list(sys.argv[1:] if argv is None else argv)
