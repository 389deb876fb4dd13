"""One unit for COCO metrics: percent; files from earlier versions (fractions, no unit) are read as percent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detr_peg.engine.evaluation.metric_units import STAT_NAMES, UNIT, format_percent, read_metrics
from detr_peg.engine.metrics_log import log_records
from detr_peg.lab.study.results import learning_curve

FRACTIONS = {name: (-1.0 if name == "APl" else 0.375 + i / 1000) for i, name in enumerate(STAT_NAMES)}
PERCENT = {name: (-1.0 if value < 0 else 100 * value) for name, value in FRACTIONS.items()}


def test_a_metrics_file_of_this_version_is_read_as_it_is(tmp_path: Path) -> None:
    payload = {"bbox": PERCENT, "unit": UNIT, "num_images": 5}
    assert UNIT == "percent"
    assert read_metrics(json.loads(json.dumps(payload))) == PERCENT


def test_an_older_metrics_file_in_fractions_is_read_as_percent(tmp_path: Path) -> None:
    old = tmp_path / "metrics.json"
    old.write_text(json.dumps({"bbox": FRACTIONS, "num_images": 5, "annotations": "val.json"}))
    metrics = read_metrics(json.loads(old.read_text()))
    assert metrics == pytest.approx(PERCENT) and metrics["AP"] == pytest.approx(37.5) and metrics["APl"] == -1.0


def test_learning_curves_of_old_and_new_logs_are_both_in_percent(tmp_path: Path) -> None:
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    old.write_text(json.dumps({"type": "eval", "iteration": 10, **FRACTIONS}) + "\n")
    new.write_text(json.dumps({"type": "eval", "iteration": 10, **PERCENT, "unit": "percent"}) + "\n")
    for log in (old, new):
        ((iteration, ap),) = learning_curve(log_records(log))
        assert iteration == 10 and ap == pytest.approx(37.5)


@pytest.mark.parametrize(("value", "text"), [(37.5, "37.5 %"), (0.0, "0.0 %"), (-1.0, "n/a"), (None, "n/a")])
def test_format_percent(value, text) -> None:
    assert format_percent(value) == text and format_percent(value, 8) == f"{text:>8}"
