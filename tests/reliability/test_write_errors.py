"""Rule: an output that cannot be written is one line naming it, the reason and what to do; exit 2; nothing lost.

Every command declares what it writes, and before it computes anything each
output folder is created and locked and each file name is tried as the atomic
writer will write it (``detr_peg.outputs.guard_outputs``); what
still fails while writing goes through the one writer (or, naming a file, the
command line's ``OSError`` rule). The faults below are the kinds of operating
system refusal a user meets, and every command that writes meets each of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_process import can_drop_file_access_override
from tests.reliability.conftest import (
    BASE,
    IMAGES,
    OUT,
    assert_one_line_error,
    assert_outputs_kept,
    running_as_root,
    snapshot,
)

LONG = "n" * 300  # longer than any file system allows for one name (255 bytes on ext4, xfs, btrfs, tmpfs)


def _commands(target: str) -> dict[str, list[str]]:
    """Each writing command with its output pointed at ``target`` (a folder, or a file for bench/export)."""
    checkpoint = str(OUT / "checkpoint.pth")
    return {
        "train": ["train", *BASE, f"train.output_dir={target}", "train.epochs=1"],
        "eval": ["eval", "--checkpoint", checkpoint, "--output", target],
        "predict": ["predict", "--checkpoint", checkpoint, str(IMAGES), "--output", target],
        "demo": ["demo", "--data-only", "--output", target],
        "export": ["export", "--checkpoint", checkpoint, "--output", f"{target}/model.onnx"],
        "bench": ["bench", "--modes", "infer", "--output", f"{target}/bench.json"],
    }


def _file_in_the_path(case: Path) -> tuple[str, list, str]:
    (case / "afile").write_text("a file where a folder is expected\n")
    return "afile/sub", [], "afile is a file, not a folder; choose another path"


def _link_to_nothing_in_the_path(case: Path) -> tuple[str, list, str]:
    (case / "gone").symlink_to(case / "unmounted")
    return "gone/sub", [], f"gone is a symbolic link to {case / 'unmounted'}, which does not exist; choose another path"


def _name_too_long(case: Path) -> tuple[str, list, str]:
    return LONG, [], "File name too long; choose a shorter name"


def _no_permission(case: Path) -> tuple[str, list, str]:
    limits = []
    if running_as_root():
        reason = can_drop_file_access_override()
        if reason is not None:
            pytest.skip(f"running as root, where every folder is writable, and {reason}")
        limits.append(("no_dac_override",))
    (case / "locked").mkdir()
    (case / "locked").chmod(0o555)
    return "locked/sub", limits, "Permission denied; choose a folder you can write to"


FAULTS = {
    "file in the path": _file_in_the_path,
    "link to nothing in the path": _link_to_nothing_in_the_path,
    "name too long": _name_too_long,
    "no permission": _no_permission,
}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("command", list(_commands("x")))
def test_an_unwritable_output_is_one_line_before_any_work(cli, case: Path, command: str, fault: str) -> None:
    target, limits, reason = FAULTS[fault](case)
    before = snapshot(case)
    result = cli.run(_commands(target)[command], cwd=case, limits=limits)
    assert_one_line_error(result, reason)
    assert_outputs_kept(before, case)


def test_a_folder_where_the_output_file_goes_is_refused(cli, case: Path) -> None:
    (case / "taken.onnx").mkdir()
    before = snapshot(case)
    result = cli.run(["export", "--checkpoint", OUT / "checkpoint.pth", "--output", "taken.onnx"], cwd=case)
    assert_one_line_error(result, "taken.onnx", "folder")
    assert_outputs_kept(before, case)


@pytest.mark.parametrize("command", ["eval", "predict", "demo"])
def test_a_disk_that_fills_while_writing_is_one_line(cli, case: Path, command: str) -> None:
    """Past the checks, a write that fails (here: a file-size limit, like a full disk) still is one sentence."""
    before = snapshot(case / OUT)
    args = _commands("later")[command]
    result = cli.run(args, cwd=case, limits=[("fsize", 256)])
    line = assert_one_line_error(result, "later")
    assert "File too large" in line or "No space left" in line, line
    assert_outputs_kept(before, case / OUT)


def test_plot_into_a_run_whose_plots_name_is_a_file(cli, case: Path) -> None:
    (case / OUT / "plots").write_text("not a folder\n")
    before = snapshot(case / OUT)
    result = cli.run(["plot", OUT], cwd=case)
    assert_one_line_error(result, "plots", "is a file, not a folder")
    assert_outputs_kept(before, case / OUT)


def test_an_annotation_file_name_with_a_nul_byte_is_named(cli, case: Path) -> None:
    import json

    annotations = case / "data" / "annotations.json"
    data = json.loads(annotations.read_text())
    data["images"][0]["file_name"] = "img\u00000.jpg"
    annotations.write_text(json.dumps(data))
    result = cli.run(["train", *BASE, "train.output_dir=fresh", "train.epochs=1"], cwd=case)
    assert_one_line_error(result, str(annotations.relative_to(case)), "NUL character")
    assert not (case / "fresh").exists()


def test_a_stop_signal_while_probing_an_output_leaves_no_probe(tmp_path: Path, monkeypatch) -> None:
    """The writability probe (``.NAME.tmp-PID``) goes even when a stop signal's exception lands between its
    creation and its removal (a SIGTERM at start-up had left one in an evaluation's folder)."""
    import os

    from detr_peg import outputs as output_guard
    from detr_peg.outputs import Output, _check_writable

    real_close = os.close

    def close_then_interrupt(fd: int) -> None:
        real_close(fd)
        raise KeyboardInterrupt  # as the stop handler raises it, right after the probe was created

    monkeypatch.setattr(output_guard.os, "close", close_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        _check_writable([Output(tmp_path, "--output", ("metrics.json",))])
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    _check_writable([Output(tmp_path, "--output", ("metrics.json",))])  # and a probe that completes
    assert list(tmp_path.iterdir()) == []
