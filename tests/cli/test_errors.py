"""User errors of the train, eval and predict commands: one line on stderr, exit status 2."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import pytest

import detr_peg
import detr_peg.cli.main as cli_main
from detr_peg.cli.main import main, out_of_memory
from tests.conftest import REPO_ROOT

CONFIG = str(REPO_ROOT / "configs" / "detr_r50_peg.yaml")


def _one_line_error(capsys, argv: list[str]) -> str:
    status = main(argv)
    err = capsys.readouterr().err.strip()
    assert status == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["train", "--config", CONFIG, "train.lrr=1e-4", "--print-config"], "unknown key 'train.lrr'"),
        (["train", "--config", CONFIG, "train.epochs=many", "--print-config"], "'train.epochs' must be an integer"),
        (["train", "--config", CONFIG, "train.lr"], "is not of the form key=value"),
        (["train", "--config", "no/such.yaml"], "Config file no/such.yaml does not exist"),
        (["train", "--config", CONFIG, "train.amp=fp16", "train.device=cpu"], "train.amp=fp16 needs a CUDA device"),
        (["train", "--config", CONFIG, "data.train_images=null"], "but data.train_images is not (command line)"),
        (["train", "--config", CONFIG, "data.train_images=null", "data.train_annotations=null"], "is not set"),
        (["train", "--config", CONFIG, "data.val_annotations=null", "--print-config"], "set both, or neither"),
        (["eval", "--checkpoint", "missing.pth"], "The checkpoint file missing.pth does not exist"),
        (["train", "--output", "a", "train.output_dir=b"], "--output and train.output_dir=b both set train.output_dir"),
        (["train", "--output=a", " train.output_dir =a"], "--output and  train.output_dir =a both set"),
        (["eval", "--checkpoint", "c.pth", "train.output_dir=b", "--output", "a"], "--output and train.output_dir=b"),
        (["predict", "x.jpg", "--checkpoint", "c.pth", "--device", "cpu", "train.device=cuda"], "--device and train"),
        (["demo", "--resume", "train.resume=false"], "--resume and train.resume=false both set train.resume"),
        (["train", "--output", "no/run", "--resume"], "--resume: no/run holds no run to resume (no config.yaml)"),
        (["train", "--resume"], "--resume without --config needs --output, the folder of the run to resume."),
    ],
)
def test_user_errors_are_one_line(argv, expected, capsys) -> None:
    assert expected in _one_line_error(capsys, argv)


def test_a_missing_argument_is_named_alone(capsys) -> None:
    """Optional overrides after a required argument are not listed as required (argparse's nargs="*" default)."""
    assert main(["convert", "src.pth"]) == 2  # returned, as every other status is
    assert capsys.readouterr().err.strip().endswith("error: the following arguments are required: dst (see "
                                                    "detr-peg convert --help)")  # fmt: skip


def test_main_returns_the_status_of_usage_errors_and_help(capsys) -> None:
    """``main`` run inside a program returns argparse's statuses too, never raising SystemExit."""
    assert main(["train", "--no-such-option"]) == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err
    assert main(["eval", "--help"]) == 0
    assert "usage: detr-peg eval" in capsys.readouterr().out
    assert main(["no-such-command"]) == 2
    capsys.readouterr()
    assert main([]) == 2
    assert capsys.readouterr().err == "detr-peg: error: the following arguments are required: COMMAND\n"


def test_predict_errors(capsys, tmp_path: Path) -> None:
    assert "does not exist" in _one_line_error(capsys, ["predict", "--checkpoint", "x.pth", str(tmp_path / "nope.jpg")])
    (tmp_path / "empty").mkdir()
    assert "holds no image files" in _one_line_error(
        capsys, ["predict", "--checkpoint", "x.pth", str(tmp_path / "empty")]
    )


def test_sigterm_while_the_command_line_is_parsed_is_one_line(capsys, monkeypatch) -> None:
    """The SIGTERM handler is in place from main's first line: a stop during parsing is one line and 143."""
    parse = cli_main.parse_command

    def parse_then_stop(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - parse_command's arguments
        parsed = parse(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return parsed

    monkeypatch.setattr(cli_main, "parse_command", parse_then_stop)

    def too_early(signum: int, frame: object) -> None:
        raise AssertionError("SIGTERM came to the handler that was there before main's")

    before = signal.signal(signal.SIGTERM, too_early)
    try:
        status = main(["eval", "--checkpoint", "missing.pth"])
        assert signal.getsignal(signal.SIGTERM) is too_early  # main puts back what it found
    finally:
        signal.signal(signal.SIGTERM, before)
    err = capsys.readouterr().err.strip()
    assert status == 143, err
    assert err == "detr-peg eval: stopped by SIGTERM; the files it finished are complete and none is half-written"


def test_a_library_warning_of_several_lines_is_one_line(capsys, monkeypatch) -> None:
    """torch's DDP warnings span lines; each warning is one stderr line naming the command."""
    import warnings

    import detr_peg.cli.configs as configs_command

    def run(args) -> int:
        warnings.warn(
            "Grad strides do not match bucket view strides.\n  grad.sizes() = [8], strides() = [1]", stacklevel=1
        )
        return 0

    monkeypatch.setattr(configs_command, "run", run)
    assert main(["configs", "list"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "detr-peg configs: warning: Grad strides do not match bucket view strides. grad.sizes() = [8], strides() = [1]"
    ]


@pytest.mark.parametrize(
    ("allocated", "shown"),
    [(52428800, "50.0 MiB"), (2**31, "2.0 GiB"), (107374182, "102.4 MiB"), (107374183, "0.1 GiB")],
)
def test_a_failed_allocation_names_its_size_in_a_unit_that_shows_it(allocated: int, shown: str) -> None:
    exc = RuntimeError(f"DefaultCPUAllocator: can't allocate memory: you tried to allocate {allocated} bytes.")
    assert f"out of memory (an allocation of {shown} failed); lower" in out_of_memory(exc)


@pytest.mark.parametrize("name", ["no\nsuch.pth", "\x1b[2J\x1b[31mred.pth", "tab\there\u2028.pth"])
def test_names_from_the_user_are_escaped_in_errors(name: str, capsys) -> None:
    """A name with a line break or terminal codes (typed, or read from an annotation file) prints as escapes."""
    err = _one_line_error(capsys, ["eval", "--checkpoint", name])
    shown = name.encode("unicode_escape").decode("ascii")
    assert err == f"detr-peg eval: error: The checkpoint file {shown} does not exist."


def test_main_inside_a_program_leaves_its_logger_as_it_was(capsys) -> None:
    logger = logging.getLogger("detr_peg")
    level, handlers = logger.level, list(logger.handlers)
    logger.setLevel(logging.WARNING)
    try:
        assert main(["configs", "list"]) == 0
        assert logger.level == logging.WARNING and logger.handlers == handlers
    finally:
        logger.setLevel(level)


def test_main_inside_a_program_leaves_its_stdout_as_it_was(tmp_path) -> None:
    with open(tmp_path / "out.txt", "w", encoding="ascii", errors="strict") as out:
        previous, sys.stdout = sys.stdout, out
        try:
            assert main(["configs", "list"]) == 0
            assert sys.stdout is out and out.errors == "strict"
        finally:
            sys.stdout = previous


def test_main_in_several_threads_gives_the_program_its_state_back(monkeypatch, capsys) -> None:
    """Calls take turns: the last to end cannot put back what another call had put in place."""
    import threading
    import time
    import warnings

    from detr_peg.cli import configs

    listing = configs.run
    monkeypatch.setattr(configs, "run", lambda args: time.sleep(0.3) or listing(args))
    stdout, showwarning, logger = sys.stdout, warnings.showwarning, logging.getLogger("detr_peg")
    level, handlers = logger.level, list(logger.handlers)
    statuses = []
    threads = [threading.Thread(target=lambda: statuses.append(main(["configs", "list"]))) for _ in range(3)]
    [thread.start() for thread in threads]
    [thread.join() for thread in threads]
    assert statuses == [0, 0, 0]
    assert sys.stdout is stdout and warnings.showwarning is showwarning
    assert (logger.level, logger.handlers) == (level, handlers)
    assert capsys.readouterr().out.count("demo") >= 3


def test_python_dash_m_detr_peg_is_the_command_line(tmp_path) -> None:
    from tests.conftest import run_python

    version = run_python("-m", "detr_peg", "--version", cwd=tmp_path)
    assert (version.returncode, version.stdout.strip()) == (0, f"detr-peg {detr_peg.__version__}")
    refused = run_python("-m", "detr_peg", "eval", "--checkp", "x", cwd=tmp_path)
    assert refused.returncode == 2 and "--checkp is not an option" in refused.stderr
