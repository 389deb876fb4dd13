"""``detr-peg plot STUDY --publish DEST``: plan.json and the cell table, paths made relative, the same report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detr_peg.cli.main import main
from detr_peg.lab.study.cell import cell_paths, new_state, write_state
from detr_peg.lab.study.grid import EvalPlan, StudyDefinition, expand_cells, parse_axis
from detr_peg.lab.study.runner import plan_record
from detr_peg.lab.study.stored_files import CELLS_CSV, PLAN_FILE, read_cells_csv
from detr_peg.outputs import OWNERSHIP_FILE
from tests.lab.study.study_cells import write_done_cell

#: A cell's log: a path under the current folder, and two that only contain its name (they stay as they are).
LOG = "$ detr-peg train --config {here}/configs/base.yaml\nAP {ap}\nkept: /mnt{here}/z https://host{here}/q\n"
APS = {"sine_seed0": 0.30, "sine_seed1": 0.34, "peg_seed0": 0.40, "peg_seed1": 0.46, "sine_seed2": 0.31}


def _definition(configs: tuple[str, ...]) -> StudyDefinition:
    return StudyDefinition(
        configs=configs,
        axes=(parse_axis("model.position.name=sine,peg"),),
        seeds=3,
        eval=EvalPlan(scales=(1.0, 1.5), padding=True),
    )


def _finish(study: Path, cell, here: Path) -> None:
    """A done cell with what a real one also holds: a checkpoint, detections, locks, a log naming absolute paths."""
    ap = APS[cell.name.split("=")[1]]
    write_done_cell(study, cell, {("val", None): ap, ("resized", 1.0): ap, ("resized", 1.5): ap - 0.1,
                                  ("padding", "mixed"): ap - 0.02, ("padding", "single"): ap})  # fmt: skip
    paths = cell_paths(study, cell)
    (paths.run / "checkpoint.pth").write_bytes(b"\x80weights" * 100)
    (paths.run / "detections.json").write_text("[]")
    (paths.eval / "detections.json").write_text("[]")
    (paths.run / ".detr-peg.lock").write_text("")
    (paths.run / ".detr-peg.lock.json").write_text('{"pid": 1}')
    (paths.eval / ".metrics.json.tmp-12345").write_text("half")
    (paths.run / OWNERSHIP_FILE).write_text(json.dumps({"written_by": "detr-peg", "names": {"config.yaml": "train"}}))
    (paths.run / "config.yaml").write_text(f"data:\n  val_images: {here}/data/val\n")
    (paths.run / "curve.bin").write_bytes(bytes(range(256)))  # not text: copied byte for byte
    (paths.root / "cell.log").write_text(LOG.format(here=here, ap=ap))


@pytest.fixture
def study(tmp_path: Path, monkeypatch) -> tuple[Path, StudyDefinition, list]:
    """``src``: five of six cells done, in a folder whose files name absolute paths under ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "src"
    definition = _definition((str(tmp_path / "configs" / "base.yaml"),))
    cells = expand_cells(definition)
    for cell in cells:
        if cell.name.endswith("peg_seed2"):  # started, not finished
            write_state(cell_paths(src, cell), {**new_state(cell, {}), "status": "running"})
            (cell_paths(src, cell).run).mkdir(parents=True)
            (cell_paths(src, cell).run / "checkpoint.pth").write_bytes(b"half")
        elif not cell.name.endswith("sine_seed2"):
            _finish(src, cell, tmp_path)
    (src / PLAN_FILE).write_text(json.dumps(plan_record(src, definition, cells)))
    return src, definition, cells


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_copy_holds_the_plan_and_the_cell_table_with_relative_paths_and_draws_the_same_report(
    study, tmp_path: Path, capsys
) -> None:
    src, definition, cells = study
    assert main(["plot", "src"]) == 0
    capsys.readouterr()
    assert main(["plot", "src", "--publish", "dst"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Published 4 done cells of src to dst (4 new; 2 not done, left out)."
    assert out[-1] == "Study dst: 4 of 6 cells done; 2 not started."

    dst = tmp_path / "dst"
    here = f"{tmp_path}/"
    assert not (dst / "cells").exists()  # no cell's files: the table holds what the report needs
    assert b"weights" not in b"".join(_files(dst).values())
    plan = json.loads((dst / PLAN_FILE).read_text())
    assert plan == json.loads((src / PLAN_FILE).read_text().replace(here, ""))
    assert plan["definition"]["configs"] == ["configs/base.yaml"]
    rows = read_cells_csv(dst / CELLS_CSV)
    assert [n for n, row in rows.items() if row["published"]] == [
        n for n, row in rows.items() if row["status"] == "done"
    ]
    assert len([n for n, row in rows.items() if row["published"]]) == 4 and here not in (dst / CELLS_CSV).read_text()

    # The copy's report is the source's (its config paths relative): the same settings, per-seed values and
    # comparisons.
    ours = json.loads((src / "study.json").read_text().replace(here, ""))
    theirs = json.loads((dst / "study.json").read_text())
    assert theirs["settings"] == ours["settings"] and theirs["comparisons"] == ours["comparisons"]
    assert (dst / "plots" / "comparisons.pdf").is_file()


def test_publishing_again_adds_the_cells_done_since_and_keeps_the_rest(study, tmp_path: Path, capsys) -> None:
    src, definition, cells = study
    assert main(["plot", "src", "--publish", "dst"]) == 0
    before = read_cells_csv(tmp_path / "dst" / CELLS_CSV)
    late = next(c for c in cells if c.name.endswith("sine_seed2"))
    _finish(src, late, tmp_path)
    capsys.readouterr()
    assert main(["plot", "src", "--publish", "dst"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "Published 5 done cells of src to dst (1 new; 1 not done, left out)."
    )
    after = read_cells_csv(tmp_path / "dst" / CELLS_CSV)
    assert {k: v for k, v in after.items() if before[k]["status"] == "done"} == {
        k: v for k, v in before.items() if v["status"] == "done"
    }
    assert after[late.name]["status"] == "done" and before[late.name]["status"] == "not started"
    report = json.loads((tmp_path / "dst" / "study.json").read_text())
    sine = next(s for s in report["settings"] if s["setting"].endswith("sine"))
    assert sine["main"]["AP"]["n"] == 3


@pytest.mark.parametrize(
    "case, fragment",
    [
        ("inside", "--publish src/copy is inside RUN_OR_STUDY src, a folder it reads"),
        ("another", "dst/plan.json is the copy of another study (definition configs: ['other.yaml'] ->"),
        ("user-files", "dst/study.md exists and was not written by detr-peg"),
        ("not-a-study", "--publish copies a study: run is not a study folder (no plan.json)."),
        ("empty", "--publish is empty (''); give a value"),
        ("study-itself", "--publish src is RUN_OR_STUDY src"),
        ("damaged-cell", "Cell state src/cells/position.name=peg_seed1/cell.json"),
    ],
)
def test_a_copy_that_would_mix_or_overwrite_is_refused_in_one_line(
    study, tmp_path: Path, capsys, case: str, fragment: str
) -> None:
    src = study[0]
    dst, source = tmp_path / "dst", "src"
    if case == "inside":
        dst = src / "copy"
    elif case == "another":
        other = _definition(("other.yaml",))
        dst.mkdir()
        (dst / PLAN_FILE).write_text(json.dumps(plan_record(dst, other, expand_cells(other))))
    elif case == "user-files":
        dst.mkdir()
        (dst / "study.md").write_text("mine")
    elif case == "not-a-study":
        source = "run"
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "metrics.jsonl").write_text("")
    elif case == "study-itself":
        dst = src
    elif case == "damaged-cell":
        (src / "cells" / "position.name=peg_seed1" / "cell.json").write_text('{"status": "bogus"}')
    capsys.readouterr()
    before = _files(tmp_path)
    target = "" if case == "empty" else str(dst.relative_to(tmp_path))
    assert main(["plot", source, "--publish", target]) == 2  # the parser's own errors (an empty value) too
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    assert _files(tmp_path) == before


def test_a_cell_done_only_in_the_earlier_copy_is_kept_and_said_so(study, tmp_path: Path, capsys) -> None:
    src, definition, cells = study
    assert main(["plot", "src", "--publish", "dst"]) == 0
    again = next(c for c in cells if c.name.endswith("peg_seed1"))
    write_state(cell_paths(src, again), {**new_state(again, {}), "status": "running"})  # run again in the study
    capsys.readouterr()
    assert main(["plot", "src", "--publish", "dst"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "Published 3 done cells of src to dst (0 new; 3 not done, left out; 1 kept from the earlier copy though "
        "not done in src)."
    )
    assert out[-1] == "Study dst: 4 of 6 cells done; 2 not started."
