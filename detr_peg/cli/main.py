"""The ``detr-peg`` command line. Each command is a module with ``add_arguments(parser)`` and ``run(args) -> int``,
imported only when chosen (``--help`` loads no torch); its rules: Rule 12 of docs/guarantees.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import logging
import os
import re
import signal
import sys
import threading
import unicodedata
import warnings
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import NoReturn

from tqdm import tqdm

from detr_peg import registry
from detr_peg.engine.memory_allocator import retain_freed_memory
from detr_peg.errors import Terminated, UserError
from detr_peg.messages import one_line

# command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("detr_peg.cli.train", "train a detector on a COCO-format dataset"),
    "eval": ("detr_peg.cli.evaluate", "evaluate a checkpoint with COCO mAP"),
    "predict": ("detr_peg.cli.predict", "detect objects in images, write JSON and pictures"),
    "demo": ("detr_peg.cli.demo", "generate a synthetic dataset, train, evaluate and predict on the CPU"),
    "convert": ("detr_peg.cli.convert", "convert an official DETR/Deformable-DETR checkpoint"),
    "bench": ("detr_peg.lab.benchmark.command", "measure latency, training-step time, memory and FLOPs"),
    "study": ("detr_peg.lab.study.command", "run a grid of trainings over configs, values and seeds; tables and plots"),
    "plot": ("detr_peg.lab.study.plot_command", "redraw the figures of a study or of a training run"),
    "export": ("detr_peg.cli.export", "export a checkpoint to ONNX (any batch and image size)"),
    "configs": ("detr_peg.cli.configs", "list the shipped configs, or copy one out for editing"),
}


#: Where :class:`_StoreOnce` notes the options given so far (removed from the parsed arguments).
_GIVEN = "_options_given"


def _shown(value: object) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


class _StoreOnce(argparse._StoreAction):
    """``store``, except that an option given a second time, or an empty value, is a usage error."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001 - argparse's signature
        if isinstance(values, str) and not values.strip():  # an empty path would be the current folder
            parser.error(f"{option_string or self.metavar or self.dest} is empty ({values!r}); give a value")
        if option_string is not None:
            given = namespace.__dict__.setdefault(_GIVEN, {})
            if self.dest in given:
                first_option, first = given[self.dest]
                if first_option == option_string:
                    both = f"{_shown(first)}, then {_shown(values)}"
                else:
                    both = f"{first_option} {_shown(first)}, then {option_string} {_shown(values)}"
                parser.error(f"option {first_option} is given twice ({both}); give it once")
            given[self.dest] = (option_string, values)
        super().__call__(parser, namespace, values, option_string)


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr (exit 2) and whose options may be given once and
    in full (``export --check`` is not ``--checkpoint``)."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - argparse's signature
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def parse_known_args(self, args=None, namespace=None):  # noqa: ANN001 - argparse's signature
        words = list(sys.argv[1:] if args is None else args)
        options = [option for action in self._actions for option in action.option_strings]
        before_separator = words[: words.index("--")] if "--" in words else words  # `-- -a.jpg`: a name
        for word in (w.split("=", 1)[0] for w in before_separator if w.startswith("--")):
            if word not in options and (full := [option for option in options if option.startswith(word)]):
                self.error(f"{word} is not an option; options are written in full: {' or '.join(full)}")
        parsed, extra = super().parse_known_args(args, namespace)
        parsed.__dict__.pop(_GIVEN, None)
        return parsed, extra

    def error(self, message: str) -> NoReturn:
        hint = f" (see {self.prog} --help)" if " " in self.prog else ""
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")


def available_commands() -> dict[str, tuple[str, str]]:
    """Commands whose module is installed (all of them in a complete install)."""
    return {name: spec for name, spec in COMMANDS.items() if importlib.util.find_spec(spec[0]) is not None}


def top_parser() -> OneLineParser:
    """``detr-peg [--version] COMMAND ...``: the command's words are parsed by its own parser."""
    from detr_peg import __version__

    commands = available_commands()
    listing = "\n".join(f"  {name:<9} {help_text}" for name, (_, help_text) in commands.items())
    parser = OneLineParser(
        prog="detr-peg",
        description="DETR and Deformable-DETR with CPVT's Positional Encoding Generator.",
        epilog=f"commands:\n{listing}\n\n`detr-peg COMMAND --help` describes each.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"detr-peg {__version__}")
    parser.add_argument("command", metavar="COMMAND", choices=list(commands), help="one of the commands below")
    return parser


def command_parser(name: str) -> tuple[OneLineParser, ModuleType]:
    """The parser of command ``name`` and its module (imported now, and only it)."""
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = OneLineParser(prog=f"detr-peg {name}", description=(module.__doc__ or help_text).strip())
    module.add_arguments(parser)
    return parser, module


#: Dashes that are not the hyphen-minus of options: the hyphens, figure, en and em dashes, minus signs.
UNICODE_DASHES = "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63\uff0d"


def parse_command(parser: argparse.ArgumentParser, module: ModuleType, words: Sequence[str]) -> argparse.Namespace:
    """Parse a command's words; leftover words join its ``POSITIONAL_DEST`` list (``overrides`` by default)."""
    for word in words:  # an option pasted from a web page or a word processor, whose '--' became a dash
        if word[:1] in UNICODE_DASHES and word.lstrip(UNICODE_DASHES)[:1].isalpha() and not os.path.exists(word):
            parser.error(f"{word!r} starts with {unicodedata.name(word[0]).lower()}, not '--' (two hyphens)")
    args, extra = parser.parse_known_args(list(words))
    if extra:
        dest = getattr(module, "POSITIONAL_DEST", "overrides")
        options = [word for word in extra if word.startswith("-")]
        if options or not hasattr(args, dest):
            parser.error(f"unrecognized arguments: {' '.join(options or extra)}")
        setattr(args, dest, [*getattr(args, dest), *extra])  # a new list: the parser's default stays empty
    given = getattr(args, getattr(module, "POSITIONAL_DEST", "overrides"), None) or []
    for option, key in getattr(module, "OPTION_KEYS", {}).items():  # one setting given two ways, as twice
        clash = [w for w in given if w.split("=", 1)[0].strip() == key and not os.path.exists(w)]
        if clash and any(word == option or word.startswith(f"{option}=") for word in words):
            parser.error(f"{option} and {clash[-1]} both set {key}; give one of them")
    return args


def in_users_words(message: str, module: object, argv: Sequence[str]) -> str:
    """``message`` with config keys replaced by the ``OPTION_KEYS`` options the user typed."""
    typed = {word.split("=", 1)[0] for word in argv if word.startswith("--")}
    given_keys = {word.split("=", 1)[0] for word in argv if "=" in word and not word.startswith("-")}
    for option, key in getattr(module, "OPTION_KEYS", {}).items():
        if option in typed and key not in given_keys:
            message = re.sub(rf"(?<![\w.]){re.escape(key)}=", f"{option} ", message)
            message = re.sub(rf"(?<![\w.]){re.escape(key)}(?![\w])", option, message)
    return message


class _PlainLines(logging.Handler):
    """Writes each record's message as it is, on stdout (info) or stderr (warnings), above any progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        warning = record.levelno >= logging.WARNING  # one line, as the errors; info may be a table
        stream = sys.stderr if warning else sys.stdout
        tqdm.write(one_line(self.format(record)) if warning else self.format(record), file=stream)
        stream.flush()


def show_messages() -> Callable[[], None]:
    """Show the ``detr_peg`` logger's messages (info and above) on the terminal; returns what puts the logger's
    level and handlers back as they were (``main`` may run inside another program)."""
    logger, handler, level = logging.getLogger("detr_peg"), _PlainLines(), logging.getLogger("detr_peg").level
    logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    return lambda: (logger.removeHandler(handler), logger.setLevel(level))


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


@contextlib.contextmanager
def _terminate_on_sigterm() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` while the command runs (main thread only); the old handler comes back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


#: ``main`` swaps process-wide state (stdout, the logger, the warning display): calls in threads take turns.
_ONE_COMMAND = threading.RLock()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return the exit status; SIGTERM from the first line on exits 143 with one line.
    Calls from several threads run one after another."""
    with _ONE_COMMAND:
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # A closed stream (`>&-`, pythonw) is None: what is printed there goes nowhere, and the command runs as usual.
    closed = {name: open(os.devnull, "w") for name in ("stdout", "stderr") if getattr(sys, name) is None}  # noqa: SIM115
    for name, sink in closed.items():
        setattr(sys, name, sink)
    stdout, strict = sys.stdout, getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure")
    if strict:
        stdout.reconfigure(errors="backslashreplace")  # "é" under PYTHONIOENCODING=ascii prints as \xe9, as on stderr
    name = " ".join(["detr-peg", *_command_word(words)])
    try:
        with _terminate_on_sigterm(), warnings.catch_warnings():
            # Python's warnings as one line each, like the errors (the previous display comes back at the end).
            warnings.showwarning = lambda message, *_, **__: tqdm.write(
                f"{name}: warning: {one_line(' '.join(str(message).split()))}", file=sys.stderr
            )  # a library's warning of several lines too
            return _run_command(words)
    except SystemExit as exc:  # argparse's usage errors and --help: a status, as every other outcome is
        if isinstance(exc.code, str):  # sys.exit("message") prints it
            print(exc.code, file=sys.stderr)
        return exc.code if isinstance(exc.code, int) else 1 if exc.code else 0
    except Terminated:
        print(
            f"{name}: stopped by SIGTERM; the files it finished are complete and none is half-written",
            file=sys.stderr,
        )
        return 128 + signal.SIGTERM
    finally:
        if strict:  # main may run inside another program; a stdout that failed stays as it is
            with contextlib.suppress(OSError, ValueError):
                stdout.reconfigure(errors="strict")
        for name, sink in closed.items():
            setattr(sys, name, None)
            sink.close()


def _command_word(words: list[str]) -> list[str]:
    """``[COMMAND]`` when the words start with one, else ``[]`` (``detr-peg --help``, no words)."""
    return words[:1] if words and not words[0].startswith("-") else []


def out_of_memory(exc: BaseException) -> str | None:
    """A failed allocation (Python's, NumPy's, torch's on any device) as one sentence; None for other errors."""
    text = str(exc).strip()
    if not (isinstance(exc, MemoryError) or "out of memory" in text.lower() or "can't allocate memory" in text):
        return None
    wanted = re.search(r"(?:tried to )?allocate (\d+(?:\.\d+)?) ?(bytes|[KMGT]iB)", text)
    if wanted and wanted[2] == "bytes":  # in MiB below a tenth of a GiB, where GiB would read 0.0
        size = float(wanted[1])
        wanted = (None, f"{size / 2**30:.1f}", "GiB") if size >= 0.1 * 2**30 else (None, f"{size / 2**20:.1f}", "MiB")
    size = f" (an allocation of {wanted[1]} {wanted[2]} failed)" if wanted else ""
    return (
        f"out of memory{size}; lower what the run holds at once: the batch sizes (train.batch_size, "
        "eval.batch_size), the image sizes (data.train_scales, data.val_scale, --scales) or the model's sizes."
    )


#: What gloo and NCCL say in the processes left when one process of a run ends.
PEER_GONE = re.compile(r"closed by peer|reset by peer|remote worker|communicator was aborted")


def peer_stopped(exc: BaseException) -> str | None:
    """A collective that failed because another process of this run ended first, as one sentence; else None."""
    world = os.environ.get("WORLD_SIZE", "")
    if not (world.isdigit() and int(world) > 1 and PEER_GONE.search(str(exc))):
        return None
    return "another process of this run stopped first, and its own message says why; this process stopped with it."


def _run_command(words: list[str]) -> int:
    """Parse ``words``, run the command, and turn the errors of its user into one line and an exit status."""
    top = top_parser().parse_args(_command_word(words) or words)
    parser, module = command_parser(top.command)
    args = parse_command(parser, module, words[1:])
    args.command = top.command
    if getattr(module, "NEEDS_MODELS", True):
        # The architectures and positional encodings register the config fields that every command validates;
        # they (and torch) are imported when a registry is first read, so that an error found before that (a
        # config file that is not there) is reported at once.
        registry.fill_on_first_read(lambda: importlib.import_module("detr_peg.models"))
        retain_freed_memory()  # large tensors reuse freed memory instead of fresh pages (see the module)
    restore_messages = show_messages()
    from detr_peg.outputs import ErrorRecorder

    stdout, stdout_errors = sys.stdout, []  # a write to stdout that fails is told apart from other errors
    sys.stdout = ErrorRecorder(stdout, stdout_errors)
    try:
        status = int(module.run(args) or 0)
        # What the command printed is out before SIGTERM gets its default action back: a signal while the
        # interpreter exits must not lose the last lines ("Wrote ...") from stdout's buffer.
        sys.stdout.flush()
        return status
    except UserError as exc:
        message = one_line(in_users_words(str(exc), module, words))  # names from files: no line breaks, no escapes
        print(f"detr-peg {top.command}: error: {message}", file=sys.stderr)
        # A stop on a signal exits with 128 + its number (130 SIGINT, 143 SIGTERM).
        return int(getattr(exc, "exit_code", 2))
    except BrokenPipeError:
        # The reader of the output went away (`detr-peg configs list | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as exc:
        if exc in stdout_errors:  # `> /dev/full`, or a full disk under stdout's file
            os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())  # no second error at exit
            print(
                f"detr-peg {top.command}: error: standard output cannot be written ({exc.strerror or exc}); "
                "the files the command finished are complete.",
                file=sys.stderr,
            )
            return 2
        if exc.filename is None:  # an operating-system error about no file is a bug: keep its traceback
            raise
        from detr_peg.outputs import describe_os_error

        print(f"detr-peg {top.command}: error: {one_line(describe_os_error(exc))}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as exc:
        reason = out_of_memory(exc) or peer_stopped(exc)
        if reason is None:
            raise
        print(f"detr-peg {top.command}: error: {reason}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"detr-peg {top.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout = stdout
        restore_messages()


if __name__ == "__main__":
    sys.exit(main())
