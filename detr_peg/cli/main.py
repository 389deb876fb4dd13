"""The ``detr-peg`` command line: ``detr-peg <command> [options] [key=value ...]``.

Each command lives in its own module of :mod:`detr_peg.cli` exposing
``add_arguments(parser)`` and ``run(args) -> int``. Errors caused by user
input (:class:`~detr_peg.errors.UserError`) are printed as one line without a
traceback and exit with status 2 (a training run stopped by SIGINT/SIGTERM
after writing its checkpoint: 128 + the signal number); anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

# The architectures and positional encodings register the config fields that every command validates.
import detr_peg.models  # noqa: F401
from detr_peg.cli.command_line import OneLineParser, command_argv, in_users_words, parse_command_line
from detr_peg.engine.memory_allocator import retain_freed_memory
from detr_peg.errors import UserError
from detr_peg.guards.output_guard import claims_mark, settle_claims

# command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("detr_peg.cli.train", "train a detector on a COCO-format dataset"),
    "eval": ("detr_peg.cli.evaluate", "evaluate a checkpoint with COCO mAP"),
    "predict": ("detr_peg.cli.predict", "detect objects in images, write JSON and pictures"),
    "demo": ("detr_peg.cli.demo", "generate a synthetic dataset, train, evaluate and predict on the CPU"),
    "convert": ("detr_peg.cli.convert", "convert an official DETR/Deformable-DETR checkpoint"),
    "bench": ("detr_peg.cli.bench", "measure latency, training-step time, memory and FLOPs"),
    "study": ("detr_peg.cli.study", "run a grid of trainings over configs, values and seeds; tables and plots"),
    "plot": ("detr_peg.cli.plot", "redraw the figures of a study or of a training run"),
    "export": ("detr_peg.cli.export", "export a checkpoint to ONNX (any batch and image size)"),
}


def available_commands() -> dict[str, tuple[str, str]]:
    """Commands whose module is installed (all of them in a complete install)."""
    return {name: spec for name, spec in COMMANDS.items() if importlib.util.find_spec(spec[0]) is not None}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, object]]:
    parser = OneLineParser(
        prog="detr-peg",
        description="DETR and Deformable-DETR with CPVT's Positional Encoding Generator.",
    )
    from detr_peg import __version__

    parser.add_argument("--version", action="version", version=f"detr-peg {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules = {}
    for name, (module_name, help_text) in available_commands().items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip())
        module.add_arguments(command)
        modules[name] = module
    return parser, modules


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser, modules = build_parser()
    args = parse_command_line(parser, modules, argv)
    retain_freed_memory()  # large tensors reuse freed memory instead of fresh pages (see the module)
    mark = claims_mark()  # a command run inside another (a study's cells) settles only its own claims
    try:
        return int(modules[args.command].run(args) or 0)
    except UserError as exc:
        message = in_users_words(str(exc), modules[args.command], command_argv(argv))
        print(f"detr-peg {args.command}: error: {message}", file=sys.stderr)
        # A stop on a signal exits with 128 + its number (130 SIGINT, 143 SIGTERM).
        return int(getattr(exc, "exit_code", 2))
    except KeyboardInterrupt:
        print(f"detr-peg {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        settle_claims(mark)


if __name__ == "__main__":
    sys.exit(main())
