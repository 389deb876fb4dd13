"""Atomic writes: the whole new content or the old file, never a partial one, and no temporary file left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from detr_peg.checkpoint.files import atomic_torch_save, read_checkpoint_file
from detr_peg.errors import OutputError, TrainingError
from detr_peg.outputs import atomic_write, atomic_write_text, save_figure


def test_text_and_torch_files_are_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    assert atomic_write_text(path, "a: 1\n") == path
    atomic_write_text(path, "b: ü\n")
    assert path.read_bytes() == "b: ü\n".encode()
    atomic_torch_save({"iteration": 3}, tmp_path / "checkpoint.pth")
    assert read_checkpoint_file(tmp_path / "checkpoint.pth") == {"iteration": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pth", "config.yaml"]


def test_a_failed_write_keeps_the_previous_file_and_removes_its_temporary(tmp_path: Path) -> None:
    path = tmp_path / "metrics.json"
    atomic_write_text(path, "old\n")

    def write_then_fail(handle) -> None:
        handle.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match=r"^Could not write .*metrics\.json: No space left on device; "):
        atomic_write(path, write_then_fail)
    with pytest.raises(
        TrainingError,
        match=r"^Could not write .*metrics\.json: No space left on device; free some space or choose a folder on another disk\.$",
    ):
        atomic_write(path, write_then_fail, error=TrainingError)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


@pytest.mark.skipif(os.name != "posix", reason="stale temporaries are recognised by their writer's process id")
def test_the_temporary_of_a_killed_writer_goes_with_the_next_write(tmp_path: Path) -> None:
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead, alive = int(finished.stdout), os.getppid()  # a process that is gone, and one that is running
    (tmp_path / f".config.yaml.tmp-{dead}").write_text("half")
    (tmp_path / f".config.yaml.tmp-{alive}").write_text("being written")
    (tmp_path / f".checkpoint.pth.tmp-{dead}").write_text("another file's")
    atomic_write_text(tmp_path / "config.yaml", "a: 1\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".checkpoint.pth.tmp-{dead}",
        f".config.yaml.tmp-{alive}",
        "config.yaml",
    ]


@pytest.mark.parametrize("suffix", [".pdf", ".png"])
def test_a_redrawn_figure_writes_the_same_bytes(tmp_path: Path, suffix: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for attempt in range(2):
        figure, axes = plt.subplots()
        axes.plot([1.0, 1.5, 2.0], [40.0, 20.0, 10.0], marker="o")
        axes.set_title("AP against scale")
        path = save_figure(tmp_path / f"figure{attempt}{suffix}", figure)
        plt.close(figure)
        written.append(path.read_bytes())
        if attempt == 0:
            time.sleep(1.1)  # a creation date, if written, would differ
    assert written[0] == written[1]
    assert b"CreationDate" not in written[0]
