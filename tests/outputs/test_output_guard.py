"""The output guard on its own: aliases, ownership by kind, and claims taken back when a command fails."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from detr_peg.errors import UserError
from detr_peg.outputs import (
    HOLDER_FILE,
    LOCK_FILE,
    OWNERSHIP_FILE,
    Input,
    Output,
    guard_outputs,
    holder_alive,
    owned_names,
    remove_stale,
)
from tests.conftest import run_python


def test_a_hard_link_of_an_input_is_the_input(tmp_path: Path) -> None:
    (tmp_path / "src.pth").write_bytes(b"weights")
    os.link(tmp_path / "src.pth", tmp_path / "dst.pth")
    with pytest.raises(UserError, match="DST .*dst.pth is the same file as SRC .*src.pth"):
        guard_outputs("convert", [Input(tmp_path / "src.pth", "SRC")], [Output(tmp_path / "dst.pth", "DST")])


def test_ownership_is_by_kind_of_command(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with guard_outputs("train", [], [Output(run, "train.output_dir", ("metrics.json", "checkpoint.pth"))]):
        (run / "metrics.json").write_text("{}")
        (run / "checkpoint.pth").write_text("x")
    with guard_outputs("eval", [], [Output(run, "--output", ("metrics.json",))]):  # eval may replace a run's metrics
        with pytest.raises(UserError, match="was written by detr-peg train, not convert"):
            guard_outputs("convert", [], [Output(run / "checkpoint.pth", "DST")])


def test_a_failed_command_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    folder = tmp_path / "pred"
    with guard_outputs("predict", [], [Output(folder, "--output", ("predictions.json", "a.png"))]):
        (folder / "predictions.json").write_text("[]")
        (folder / "a.png").write_text("png")
    ledger = (folder / OWNERSHIP_FILE).read_bytes()
    with pytest.raises(RuntimeError, match="the command failed"):
        with guard_outputs("predict", [], [Output(folder, "--output", ("predictions.json", "a.png", "b.png"))]):
            assert b"b.png" in (folder / OWNERSHIP_FILE).read_bytes()
            raise RuntimeError("the command failed")
    assert (folder / OWNERSHIP_FILE).read_bytes() == ledger  # b.png was never written: the earlier bytes are back
    new = tmp_path / "new"
    with guard_outputs("predict", [], [Output(new, "--output", ("predictions.json",))]):
        assert new.is_dir()
    assert not new.exists()  # created for the claim, empty, removed


def test_a_command_inside_another_settles_only_its_own_claims(tmp_path: Path) -> None:
    """A study runs each cell's train command in its process: the cell's end must not settle the study's claims."""

    outer, inner = tmp_path / "study", tmp_path / "study" / "cells" / "a"
    with guard_outputs("study", [], [Output(outer, "--output", ("plan.json", "plots"))]):
        with guard_outputs("train", [], [Output(inner, "train.output_dir", ("checkpoint.pth", "metrics.json"))]):
            (inner / "metrics.json").write_text("{}")
        # the cell ended: its unused checkpoint.pth claim went, the study's claims stay
        assert json.loads((inner / OWNERSHIP_FILE).read_text())["names"] == {"metrics.json": "train"}
        assert json.loads((outer / OWNERSHIP_FILE).read_text())["names"] == {"plan.json": "study", "plots": "study"}
        (outer / "plots").mkdir()  # the study draws its figures after the cells
    assert json.loads((outer / OWNERSHIP_FILE).read_text())["names"] == {"plots": "study"}


_CLAIM_AND_DIE = """
import os, sys
from detr_peg.outputs import Output, guard_outputs
guard_outputs("eval", [], [Output(sys.argv[1], "--output", ("metrics.json", "detections.json"))])
os._exit(1)  # killed, or unable to rewrite the ownership file (out of open files): its claims are never settled
"""


def test_claims_of_a_process_that_ended_unsettled_own_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "eval"
    assert run_python("-c", _CLAIM_AND_DIE, str(folder)).returncode == 1
    assert json.loads((folder / OWNERSHIP_FILE).read_text())["names"] == {
        "metrics.json": "eval",
        "detections.json": "eval",
    }
    (folder / "metrics.json").write_text('{"mine": 1}')  # the user's file, where the dead claim points
    with pytest.raises(UserError, match=r"metrics.json exists and was not written by detr-peg; eval replaces only"):
        guard_outputs("eval", [], [Output(folder, "--output", ("metrics.json",))])
    assert (folder / "metrics.json").read_text() == '{"mine": 1}'
    # A name that is still free is claimed afresh; --resume (adopt) takes a file the dead claim points at.
    with guard_outputs("eval", [], [Output(folder, "--output", ("detections.json",))]):
        (folder / "detections.json").write_text("[]")
    with guard_outputs("train", [], [Output(folder, "--output", ("metrics.json",), kind="eval", adopt=True)]):
        pass
    assert json.loads((folder / OWNERSHIP_FILE).read_text()) == {
        "written_by": "detr-peg", "names": {"detections.json": "eval", "metrics.json": "eval"}
    }  # fmt: skip


_FAIL_OUT_OF_MEMORY = """
import sys
from detr_peg.outputs import RECORD_LIMIT, Output, guard_outputs
from tests.cli_process import apply_limits
with guard_outputs("train", [], [Output(sys.argv[1], "--output", ("checkpoint.pth",))]):
    apply_limits([("memory", RECORD_LIMIT // 4)])  # the failed step's tensors still hold the rest
    print("claimed", flush=True)
"""


def test_a_command_out_of_memory_still_settles_its_claims(tmp_path: Path) -> None:
    """Reading the ownership file reserved its 256 MiB bound: a run out of memory left its claims unsettled."""
    result = run_python("-c", _FAIL_OUT_OF_MEMORY, str(tmp_path / "big"))
    assert (result.returncode, result.stdout) == (0, "claimed\n"), result.stderr
    assert not (tmp_path / "big").exists()  # created for the claim, settled: removed


_WRITE_ONE = """
import sys
from pathlib import Path
from detr_peg.errors import UserError
from detr_peg.outputs import Output, guard_outputs
try:
    with guard_outputs("predict", [], [Output(sys.argv[1], "--output", ("a.json",))]):
        (Path(sys.argv[1]) / "a.json").write_text("[]")
    print("written")
except UserError as exc:
    print(exc)
"""


@pytest.mark.parametrize("kind", ["link", "fifo"])
@pytest.mark.parametrize("name", [LOCK_FILE, HOLDER_FILE, OWNERSHIP_FILE])
def test_a_state_file_that_is_a_link_or_a_fifo_is_never_followed(tmp_path: Path, name: str, kind: str) -> None:
    folder, outside = tmp_path / "out", tmp_path / "notes.txt"
    folder.mkdir()
    outside.write_text("mine")
    (folder / name).symlink_to(outside) if kind == "link" else os.mkfifo(folder / name)
    proc = run_python("-c", _WRITE_ONE, str(folder), timeout=120)  # a FIFO read would block for ever
    assert outside.read_text() == "mine", proc.stderr[-2000:]
    if name == LOCK_FILE:
        assert proc.stdout == (
            f"{folder / LOCK_FILE} is not a regular file (a link, a FIFO or a folder), so detr-peg cannot lock the "
            "folder there without touching what it points at: remove it.\n"
        )
    else:
        assert proc.stdout == "written\n" and (folder / "a.json").read_text() == "[]"


def test_the_ownership_file_names_only_plain_files_of_its_folder(tmp_path: Path) -> None:
    """A tampered record cannot point outside its folder, nor name a process that cannot exist."""
    (tmp_path / "victim.png").write_text("mine")
    ledger = {"names": {"a.png": "predict", "b.png": "predict", "../victim.png": "predict",
                        str(tmp_path / "victim.png"): "predict", "..": "predict", "c/d.png": "predict"},
              "pending": {"b.png": 2**63 - 1}}  # fmt: skip
    (tmp_path / OWNERSHIP_FILE).write_text(json.dumps(ledger))
    assert owned_names(tmp_path) == {"a.png": "predict"}  # b.png's claimer cannot be alive
    (tmp_path / ".predict-tmp-99999999999999999999").mkdir()
    assert remove_stale(tmp_path, ".predict-tmp-") == [tmp_path / ".predict-tmp-99999999999999999999"]
    (tmp_path / OWNERSHIP_FILE).write_text('{"names": ' + "[" * 100000 + "]" * 100000 + "}")
    assert owned_names(tmp_path) == {}
    assert (tmp_path / "victim.png").read_text() == "mine"


def test_a_damaged_record_and_a_holder_with_control_characters_are_named_plainly(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "metrics.json").write_text("{}")
    (folder / OWNERSHIP_FILE).write_text('{"names": ["metrics.json"]}')
    with pytest.raises(UserError) as info:
        guard_outputs("eval", [], [Output(folder, "--output", ("metrics.json",))])
    assert str(info.value) == (
        f"{folder / 'metrics.json'} exists and was not written by detr-peg (the record of detr-peg's files there, "
        f"{OWNERSHIP_FILE}, is damaged); eval replaces only files it wrote itself: move it or choose another --output."
    )
    holder = {"pid": os.getpid(), "host": "h", "command": "eval", "since": "\x1b[2Jnow\nsecond line"}
    (folder / HOLDER_FILE).write_text(json.dumps(holder))
    assert holder_alive(folder) is None  # read as no holder: its fields would print escapes and a second line
