"""Rule: a command checks all of its inputs before its first write; a refused command leaves no file behind.

Here test scales that would size the validation images below the smallest
side accepted (``MIN_IMAGE_SIDE``). ``eval`` refuses them before its first
evaluation, so neither ``metrics.json`` nor ``detections.json`` is written,
and the earlier run is left byte-identical.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.conftest import OUT, assert_one_line_error, assert_outputs_kept, snapshot


@pytest.mark.parametrize("scales", ["0.001", "1,0.0001", "1e-9"])
def test_scales_below_the_smallest_image_side_are_refused_before_any_write(cli, case: Path, scales: str) -> None:
    before = snapshot(case)
    result = cli.run(["eval", "--checkpoint", OUT / "checkpoint.pth", "--output", "ev", "--scales", scales], cwd=case)
    assert_one_line_error(result, "--scales", "below the 2 px accepted", "use scales of at least")
    assert_outputs_kept(before, case)


def test_the_smallest_scale_the_message_names_is_accepted(cli, case: Path) -> None:
    result = cli.run(["eval", "--checkpoint", OUT / "checkpoint.pth", "--output", "ev", "--scales", "0.001"], cwd=case)
    least = assert_one_line_error(result).rsplit("at least ", 1)[1].rstrip(".")
    result = cli.run(["eval", "--checkpoint", OUT / "checkpoint.pth", "--output", "ev", "--scales", least], cwd=case)
    assert result.returncode == 0, result.stderr
    assert (case / "ev" / "scales_resized.json").is_file()
