"""A study folder's plan: written once, kept when only the number of seeds changes, and a changed definition refused."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from detr_peg.errors import ConfigError
from detr_peg.lab.study.cell import cell_paths, is_done, new_state, resolved_config, run_cell, write_state
from detr_peg.lab.study.grid import EvalPlan, StudyDefinition, parse_axis
from detr_peg.lab.study.publish import plan_copy, write_copy
from detr_peg.lab.study.results import collect, write_results
from detr_peg.lab.study.runner import prepare
from detr_peg.lab.study.stored_files import PLAN_FILE
from tests.lab.study.study_cells import write_done_cell


@pytest.fixture
def definition(base_config: Path) -> StudyDefinition:
    return StudyDefinition(
        configs=(str(base_config),),
        axes=(parse_axis("model.position.name=sine,peg"),),
        seeds=2,
        overrides=("model.num_queries=8",),
    )


def test_plan_records_the_definition_and_the_commands(tmp_path: Path, definition: StudyDefinition) -> None:
    cells = prepare(tmp_path / "s", definition)
    plan = json.loads((tmp_path / "s" / PLAN_FILE).read_text())
    assert StudyDefinition.from_dict(plan["definition"]) == definition
    assert [c["name"] for c in plan["cells"]] == [c.name for c in cells]
    assert plan["cells"][3]["commands"] == [
        [
            "detr-peg",
            "train",
            "--config",
            definition.configs[0],
            "--output",
            str(tmp_path / "s" / "cells" / cells[3].name / "run"),
            "--resume",
            "model.position.name=peg",
            "model.num_queries=8",
            "train.seed=1",
        ]
    ]


def test_more_seeds_are_accepted_and_other_changes_refused(tmp_path: Path, definition: StudyDefinition) -> None:
    prepare(tmp_path / "s", definition)
    assert len(prepare(tmp_path / "s", replace(definition, seeds=3))) == 6
    for changed, key in (
        (replace(definition, overrides=("model.num_queries=9",)), "overrides"),
        (replace(definition, eval=EvalPlan(scales=(2.0,))), "eval.scales"),
        (replace(definition, axes=(parse_axis("model.position.name=sine,none"),)), "axes"),
    ):
        with pytest.raises(ConfigError, match=f"another definition \\({key}"):
            prepare(tmp_path / "s", changed)


def test_an_invalid_cell_config_is_refused_before_anything_runs(tmp_path: Path, definition: StudyDefinition) -> None:
    with pytest.raises(ConfigError, match="model.num_queries"):
        prepare(tmp_path / "s", replace(definition, axes=(parse_axis("model.num_queries=8,many"),), overrides=()))
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("grid", "copy", "message"),
    [
        (
            "train.lr=0.1,1e-1",
            False,
            "The cells lr=0.1_seed0 and lr=1e-1_seed0 would train the same config (train.lr=0.1 and train.lr=1e-1 "
            "read as one value); give each grid value once.",
        ),
        (
            None,
            True,
            "The cells base_seed0 and copy_seed0 would train the same config: {tmp}/base.yaml and {tmp}/copy.yaml "
            "resolve alike; keep one of the two config files.",
        ),
    ],
    ids=["one-number-two-spellings", "a-copy-of-the-base-config"],
)
def test_two_cells_of_one_config_are_refused_before_anything_runs(
    tmp_path: Path, base_config: Path, grid: str | None, copy: bool, message: str
) -> None:
    configs = (str(base_config),)
    if copy:
        (tmp_path / "copy.yaml").write_text(base_config.read_text())
        configs += (str(tmp_path / "copy.yaml"),)
    definition = StudyDefinition(configs=configs, axes=(parse_axis(grid),) if grid else ())
    with pytest.raises(ConfigError) as info:
        prepare(tmp_path / "s", definition)
    assert str(info.value) == message.format(tmp=tmp_path)
    assert not (tmp_path / "s").exists()
    # values that differ once read are two settings
    axes = (parse_axis("train.lr=0.1,0.01"),)
    assert len(prepare(tmp_path / "s", StudyDefinition(configs=(str(base_config),), axes=axes))) == 2


def test_a_cell_recorded_before_a_config_field_existed_resumes_and_a_changed_one_is_refused(
    tmp_path: Path, base_config: Path, definition: StudyDefinition
) -> None:
    """A field added to the config schema after a cell started takes its default when the record is read; a
    recorded value that differs from the cell's config now is still a change, and so is a new field whose value
    in the config now is not its default."""
    cells = prepare(tmp_path / "s", definition)
    paths = cell_paths(tmp_path / "s", cells[0])
    recorded = resolved_config(cells[0])
    del recorded["eval"]["extra_padding"]  # as a version without the field recorded it
    write_state(paths, {**new_state(cells[0], recorded), "status": "done"})
    assert prepare(tmp_path / "s", definition) == cells

    write_state(paths, {**new_state(cells[0], {**recorded, "eval": {**recorded["eval"], "score_threshold": 0.25}})})
    with pytest.raises(ConfigError, match=r"\(eval.score_threshold: 0.25 -> 0.5\) changed since it was started"):
        prepare(tmp_path / "s", definition)

    write_state(paths, {**new_state(cells[0], recorded), "status": "done"})
    base_config.write_text(base_config.read_text() + "eval:\n  extra_padding: 0.5\n")  # the base config edited
    with pytest.raises(ConfigError, match=r"\(eval.extra_padding: 0.0 -> 0.5\) changed since it was started"):
        prepare(tmp_path / "s", definition)


@pytest.mark.parametrize("stage", ["train", "eval"])
def test_a_signal_no_command_took_over_records_the_cell_as_interrupted(
    tmp_path: Path, definition: StudyDefinition, stage: str
) -> None:
    """A ``KeyboardInterrupt`` while a cell's command starts (before it installed its own handlers), or between
    its commands: ``cell.json`` says ``interrupted``, not ``running``, and the interrupt goes on."""
    cells = prepare(tmp_path / "s", replace(definition, eval=EvalPlan(padding=True)))
    paths = cell_paths(tmp_path / "s", cells[0])
    ran = []

    def run_command(argv: list[str], log: Path) -> tuple[int, str | None]:
        ran.append(argv[0])
        if argv[0] == stage:
            raise KeyboardInterrupt
        return 0, None

    with pytest.raises(KeyboardInterrupt):
        run_cell(cells[0], paths, EvalPlan(padding=True), run_command)
    state = json.loads(paths.state.read_text())
    assert ran == ["train", "eval"][: ran.index(stage) + 1] and state["status"] == "interrupted"
    assert state["error"] == "stopped by a signal"
    assert state["stages"] == ({} if stage == "train" else {"train": "done"})


def test_a_study_kept_as_its_cell_table_resumes_with_its_done_cells_and_refuses_a_changed_config(
    tmp_path: Path, base_config: Path, definition: StudyDefinition
) -> None:
    """What a shipped study keeps (plan.json and cells.csv) is enough to continue it on another machine: the
    cells done in the table are not run again, and a config that changed since they ran is refused."""
    source, study = tmp_path / "s", tmp_path / "copy"
    cells = prepare(source, definition)
    for cell in cells[:2]:
        write_done_cell(source, cell, {("val", None): 0.4}, config=resolved_config(cell))
    copy = plan_copy(source, study)  # the published form: plan.json and the done cells' rows, no cell folders
    write_copy(copy, study)
    assert copy.copied == [cells[0].name, cells[1].name] and not (study / "cells").exists()
    assert [is_done(study, c) for c in cells] == [True, True, False, False]
    assert prepare(study, definition) == cells
    assert collect(study, definition, cells)["cells"][0]["metrics"]["AP"] == pytest.approx(40.0)

    base_config.write_text(base_config.read_text() + "eval:\n  extra_padding: 0.5\n")
    with pytest.raises(ConfigError, match=r"\(eval.extra_padding: 0.0 -> 0.5\) and 1 more changed since it was started; restore "
                       r"the base config, or remove their rows from cells.csv"):  # fmt: skip
        prepare(study, definition)


def test_a_deleted_cell_folder_runs_again_unless_its_row_was_published(
    tmp_path: Path, definition: StudyDefinition
) -> None:
    study = tmp_path / "s"
    cells = prepare(study, definition)
    write_done_cell(study, cells[0], {("val", None): 0.4}, config=resolved_config(cells[0]))
    write_results(study, collect(study, definition, cells))
    shutil.rmtree(cell_paths(study, cells[0]).root)  # deleted to run it again
    assert not is_done(study, cells[0])
    assert collect(study, definition, cells)["cells"][0]["status"] == "not started"
