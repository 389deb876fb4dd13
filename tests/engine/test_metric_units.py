"""One unit for COCO metrics: percent; files from earlier versions (fractions, no unit) are read as percent."""

from __future__ import annotations

import json
import math
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


def test_log_lines_no_run_writes_are_passed_over(tmp_path: Path) -> None:
    """Nesting beyond the parser's depth is skipped; numbers beyond float32 or int64 read as NaN, which every reader
    passes over (they overflowed the plots' axes)."""
    from detr_peg.cli.main import main

    run = tmp_path / "run"
    run.mkdir()
    lines = [{"type": "iter", "iteration": 1, "loss": 2.0}, "{\"x\": " + "[" * 5000 + "]" * 5000 + "}",
             {"type": "iter", "iteration": 2, "loss": 1e308}, {"type": "iter", "iteration": 10**400, "loss": 1.0},
             {"type": "iter", "iteration": 3, "loss": -3e38}, {"type": "eval", "iteration": 3, "AP": -1e308},
             {"type": "eval", "iteration": 4, **PERCENT, "unit": UNIT}]  # fmt: skip
    (run / "metrics.jsonl").write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines))
    records = list(log_records(run / "metrics.jsonl"))
    assert len(records) == 6 and [records[i]["loss"] for i in (0, 2, 3)] == [2.0, 1.0, -3e38]  # the nested one went
    assert math.isnan(records[1]["loss"]) and math.isnan(records[2]["iteration"]) and math.isnan(records[4]["AP"])
    assert learning_curve(records) == [(4, pytest.approx(37.5))]
    assert learning_curve(records, "APl") == []  # -1: undefined, not a point at -1 %
    assert main(["plot", str(run)]) == 0 and (run / "plots" / "learning_curve.png").stat().st_size > 0


@pytest.mark.parametrize(("value", "text"), [(37.5, "37.5 %"), (0.0, "0.0 %"), (-1.0, "n/a"), (None, "n/a")])
def test_format_percent(value, text) -> None:
    assert format_percent(value) == text and format_percent(value, 8) == f"{text:>8}"


@pytest.mark.parametrize(
    ("payload", "words"),
    [({"bbox": PERCENT, "unit": "permille"}, "its 'unit' is 'permille', not 'percent'"),
     ({"bbox": PERCENT}, "'AP' is 37.5, above 1 for a fraction; percent needs 'unit': 'percent'"),
     ({"bbox": PERCENT, "unit": "fraction"}, "'AP' is 37.5, above 1 for a fraction")],
    ids=["unknown-unit", "percent-without-unit", "percent-called-fractions"],
)  # fmt: skip
def test_metrics_of_no_known_unit_are_refused_not_rescaled(tmp_path: Path, payload, words) -> None:
    """A model card of a run whose ``metrics.json`` says something else refuses in one sentence naming the file."""
    from detr_peg.errors import CheckpointError
    from detr_peg.hub import run_metrics

    with pytest.raises(ValueError, match=f"^{words}"):
        read_metrics(payload)
    (tmp_path / "metrics.json").write_text(json.dumps(payload))
    with pytest.raises(CheckpointError, match=f"^{tmp_path / 'metrics.json'} cannot be read as the run's metrics"):
        run_metrics(tmp_path / "metrics.json")
    log = tmp_path / "m.jsonl"  # a log record of no known unit is skipped, as other lines that are not records
    log.write_text(json.dumps({"type": "eval", "iteration": 10, **payload["bbox"], "unit": payload.get("unit")}))
    assert learning_curve(log_records(log)) == []
