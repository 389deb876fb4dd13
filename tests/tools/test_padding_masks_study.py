"""tools/padding_masks_study.py: bad options are one line and exit 2, before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import run_python

TOOL = "tools/padding_masks_study.py"


@pytest.mark.parametrize(
    ("proxies", "output", "says"),
    [
        ("bogus", "out", "argument --proxies: 'bogus' is not a list of the proxies detr_small, deformable_small, "),
        ("", "out", "argument --proxies: '' is not a list of the proxies "),
        ("detr_small,bogus", "out", "argument --proxies: 'detr_small,bogus' is not a list of the proxies "),
        ("detr_small", "afile/out", "--output: Could not create the folder {tmp}/afile/out: {tmp}/afile is a file, "),
    ],
)
def test_bad_options_are_one_line_and_write_nothing(tmp_path: Path, proxies: str, output: str, says: str) -> None:
    (tmp_path / "afile").write_text("a file where a folder is expected\n")
    (tmp_path / "data").mkdir()  # no annotations: were the options accepted, the tool would generate them here
    proc = run_python(TOOL, "--proxies", proxies, "--output", str(tmp_path / output), "--data", str(tmp_path / "data"))
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("padding_masks_study.py: error: ") and "Traceback" not in proc.stderr
    assert says.format(tmp=tmp_path) in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "data"] and not any((tmp_path / "data").iterdir())


@pytest.mark.parametrize(
    ("tool", "args", "says"),
    [
        (TOOL, ["--data", "{tmp}/nowhere", "--output", "{tmp}/out"],
         "--data {tmp}/nowhere holds no demo dataset, and only a folder named data can be made here."),
        ("tools/layout_figures.py", ["--root", "{tmp}/nowhere"], "--root {tmp}/nowhere is not a detr_peg repository"),
        ("tools/bench_ms_deform_attn.py", ["--device", "bogus"], "argument --device: must be one of 'auto', 'cpu'"),
        *([("tools/bench_ms_deform_attn.py", ["--device", "cuda"],
            "--device is 'cuda' but CUDA is not available; use --device cpu.")] if not torch.cuda.is_available() else []),
    ],
)  # fmt: skip
def test_other_tools_refuse_bad_paths_and_devices_in_one_line(tmp_path: Path, tool: str, args: list, says: str) -> None:
    """A --data that is no dataset would have made the demo write into its parent (/ for /nowhere)."""
    proc = run_python(tool, *(a.format(tmp=tmp_path) for a in args))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and says.format(tmp=tmp_path) in lines[0], proc.stderr
    assert list(tmp_path.iterdir()) == []
