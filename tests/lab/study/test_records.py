"""The records of a study's dataclasses leave out the fields that only word messages, at any depth."""

from __future__ import annotations

import json
from dataclasses import dataclass

from detr_peg.lab.study.cell import new_state
from detr_peg.lab.study.comparisons import ComparisonOptions
from detr_peg.lab.study.grid import Axis, Cell, EvalPlan, StudyDefinition
from detr_peg.lab.study.records import message_only, record


def test_a_study_definition_is_recorded_without_where_its_axes_were_given() -> None:
    definition = StudyDefinition(
        configs=("a.yaml", "b.yaml"),
        axes=(Axis("model.position.name", ("sine", "peg"), source="s.yaml: grid"),),
        seeds=3,
        overrides=("train.epochs=2",),
        eval=EvalPlan(scales=(1.0, 1.5), canvas_scales=(2.0,), padding=True),
    )
    got = definition.to_dict()
    assert got == {
        "configs": ["a.yaml", "b.yaml"],
        "axes": [{"key": "model.position.name", "values": ["sine", "peg"]}],
        "seeds": 3,
        "overrides": ["train.epochs=2"],
        "eval": {"scales": [1.0, 1.5], "canvas_scales": [2.0], "padding": True},
    }
    # The record reads back to the same definition, and the source is not part of what it means.
    assert StudyDefinition.from_dict(json.loads(json.dumps(got))) == definition
    assert definition == StudyDefinition(
        configs=definition.configs, axes=(Axis("model.position.name", ("sine", "peg")),), seeds=3,
        overrides=definition.overrides, eval=definition.eval,
    )  # fmt: skip


def test_a_cell_state_and_the_comparison_options_leave_their_sources_out() -> None:
    cell = Cell(
        name="small_position.name=peg_seed0",
        setting="small_position.name=peg",
        config="small.yaml",
        values=(("model.position.name", "peg"),),
        seed=0,
        overrides=("model.position.name=peg", "train.seed=0"),
        sources=(("model.position.name", "s.yaml: grid"),),
    )
    state = new_state(cell, {"train": {"seed": 0}})
    assert state == {
        "name": cell.name,
        "setting": cell.setting,
        "config": "small.yaml",
        "values": [["model.position.name", "peg"]],
        "seed": 0,
        "overrides": ["model.position.name=peg", "train.seed=0"],
        "config_resolved": {"train": {"seed": 0}},
        "stages": {},
        "status": "new",
        "error": None,
    }
    options = ComparisonOptions(
        baseline="model.position.name=sine", equal_within=2.0, baseline_source="s.yaml: baseline"
    )
    assert options.to_dict() == {"baseline": "model.position.name=sine", "equal_within": 2.0}
    assert ComparisonOptions.from_dict(options.to_dict()) == options


def test_message_only_fields_are_left_out_at_any_depth_and_do_not_take_part_in_equality() -> None:
    @dataclass(frozen=True)
    class Inner:
        value: int
        where: str = message_only("here")

    @dataclass(frozen=True)
    class Outer:
        items: tuple[Inner, ...]
        table: dict
        where: str = message_only("there")

    outer = Outer((Inner(1, "a"), Inner(2)), {"k": Inner(3, "b")}, where="x")
    assert record(outer) == {"items": [{"value": 1}, {"value": 2}], "table": {"k": {"value": 3}}}
    assert Inner(1, "a") == Inner(1, "b") and hash(Inner(1, "a")) == hash(Inner(1, "b"))
    assert record(Inner) is Inner  # a class is a plain value, not a record
