"""``detr-peg study`` end to end: a 2-setting x 2-seed study of a tiny config, resumed, refused, with a failing cell.

Every cell is a real training run (2 iterations of a tiny DETR on 8 synthetic
images, evaluated after each); the tables are read back and
compared with the cells' own metrics files.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from detr_peg.cli.main import main
from detr_peg.lab.study.results import STATS, format_stat
from detr_peg.lab.study.stored_files import STUDY_FIGURES, figure_files
from tests.conftest import REPO_ROOT, python_env
from tests.lab.study.conftest import tiny_overrides, write_base_config

pytestmark = pytest.mark.slow  # real training runs: a few seconds per cell

GRID = ["--grid", "model.position.name=sine,peg", "--seeds", "2"]
#: Evaluation beyond the training size: the validation images resized, a larger canvas, batch padding.
EVAL = ["--scales", "1.5", "--canvas-scales", "1.5", "--padding"]
CELLS = [f"position.name={name}_seed{seed}" for name in ("sine", "peg") for seed in (0, 1)]


def study_args(base: Path, out: Path, data, *extra: str) -> list[str]:
    return ["study", "--config", str(base), *GRID, *EVAL, "--output", str(out), *extra, *tiny_overrides(data)]


@pytest.fixture(scope="module")
def done_study(tmp_path_factory, shapes):
    root = tmp_path_factory.mktemp("study")
    base = write_base_config(root / "base.yaml")
    assert main(study_args(base, root / "study", shapes)) == 0
    return root / "study", base


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_cell_is_a_training_run_and_the_tables_hold_its_numbers(done_study) -> None:
    study, _ = done_study
    assert sorted(p.name for p in (study / "cells").iterdir()) == sorted(CELLS)
    plan = json.loads((study / "plan.json").read_text())
    assert [c["name"] for c in plan["cells"]] == CELLS
    assert plan["cells"][0]["commands"][0][:2] == ["detr-peg", "train"]
    results = json.loads((study / "study.json").read_text())
    md = (study / "study.md").read_text()
    with open(study / "study.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for name in ("sine", "peg"):
        setting = f"position.name={name}"
        cells = [study / "cells" / f"{setting}_seed{seed}" for seed in (0, 1)]
        for cell in cells:
            state = json.loads((cell / "cell.json").read_text())
            assert state["status"] == "done" and state["stages"] == {"train": "done", "eval": "done"}
            assert (cell / "run" / "checkpoint.pth").is_file() and (cell / "run" / "config.yaml").is_file()
        own = [json.loads((cell / "eval" / "metrics.json").read_text())["bbox"] for cell in cells]
        entry = next(s for s in results["settings"] if s["setting"] == setting)
        for stat in STATS:
            defined = [m[stat] for m in own if m[stat] >= 0]
            assert entry["main"][stat]["values"] == defined
            row = next(r for r in rows if r["setting"] == setting and r["kind"] == "val" and r["metric"] == stat)
            assert [float(v) for v in row["values"].split(";") if v] == defined
        assert f"| {setting} | 2 | " + " | ".join(format_stat(entry["main"][s]) for s in STATS) + " |" in md
        # Each kind of test scale comes from its own file of each cell, in its own table.
        for kind, title in (("resized", "## Test scales: resized"), ("canvas", "## Test scales: larger canvas")):
            files = [json.loads((cell / "eval" / f"scales_{kind}.json").read_text()) for cell in cells]
            assert all(f["kind"] == kind for f in files)
            for row in entry[kind]:
                measured = [next(r for r in f["results"] if r["scale"] == row["scale"])["metrics"] for f in files]
                assert row["AP"]["values"] == [m["AP"] for m in measured if m["AP"] >= 0]
                section = md[md.index(title) :]
                section = section[: section.index("\n## ", 1)]
                line = (
                    f"| {setting} | x{row['scale']:g} | {row['size']} | {row['AP']['n']} | {format_stat(row['AP'])} |"
                )
                assert line in section
            assert [r["scale"] for r in entry[kind]] == [1.5]
        padding = [json.loads((cell / "eval" / "padding.json").read_text()) for cell in cells]
        assert entry["padding"]["AP"]["single"]["values"] == [
            p["modes"]["single"]["metrics"]["AP"] for p in padding if p["modes"]["single"]["metrics"]["AP"] >= 0
        ]
        # The learning curve is the eval records of the runs' metrics.jsonl (after each iteration).
        curves = [
            [(r["iteration"], r["AP"]) for r in records(cell / "run" / "metrics.jsonl") if r["type"] == "eval"]
            for cell in cells
        ]
        assert [it for it, _ in curves[0]] == [1, 2]
        assert [(p["iteration"], p["values"]) for p in entry["curve"]] == [
            (it, [dict(c)[it] for c in curves]) for it in (1, 2)
        ]
    assert sorted(p.name for p in (study / "plots").iterdir()) == [
        ".detr-peg-outputs.json",  # the figures are recorded as the study's (plot may redraw them)
        *sorted(figure_files(STUDY_FIGURES)),
    ]


def test_rerun_runs_only_the_missing_cells_and_resumes_an_interrupted_one(done_study, tmp_path, shapes, capsys) -> None:
    original, base = done_study
    study = tmp_path / "study"
    shutil.copytree(original, study)
    missing, interrupted, *untouched = (study / "cells" / name for name in CELLS)
    shutil.rmtree(missing)
    state = json.loads((interrupted / "cell.json").read_text())
    (interrupted / "cell.json").write_text(json.dumps({**state, "status": "running", "stages": {}}))
    stamps = {cell: (cell / "run" / "checkpoint.pth").stat().st_mtime_ns for cell in untouched}

    assert main(study_args(base, study, shapes)) == 0
    out = capsys.readouterr().out
    assert "4 cells" in out and "(2 already done)" in out
    assert {cell: (cell / "run" / "checkpoint.pth").stat().st_mtime_ns for cell in untouched} == stamps
    starts = [r["resumed_iteration"] for r in records(missing / "run" / "metrics.jsonl") if r["type"] == "start"]
    assert starts == [0]  # trained from scratch
    starts = [r["resumed_iteration"] for r in records(interrupted / "run" / "metrics.jsonl") if r["type"] == "start"]
    assert starts == [0, 2]  # continued from its checkpoint
    assert all(json.loads((c / "cell.json").read_text())["status"] == "done" for c in (missing, interrupted))


def test_a_copy_naming_its_configs_relatively_resumes_from_where_they_are(done_study, tmp_path, shapes, capsys) -> None:
    """A study published without checkpoints, its plan's config paths made relative to the repository, is the
    same study again when run from there (its done cells kept), and another study anywhere else."""
    original, base = done_study
    study = tmp_path / "published"
    shutil.copytree(original, study, ignore=shutil.ignore_patterns("*.pth", ".detr-peg*"))
    plan = json.loads((study / "plan.json").read_text())
    plan["definition"]["configs"] = [os.path.relpath(c, base.parent) for c in plan["definition"]["configs"]]
    (study / "plan.json").write_text(json.dumps(plan))
    cwd = Path.cwd()
    try:
        os.chdir(base.parent)
        assert main(study_args(base, study, shapes, "--plan")) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line for line in lines if line.startswith("# cell")] == [
            f"# cell {n} (done: the study skips it)" for n in CELLS
        ]
        os.chdir(tmp_path)
        assert main(study_args(base, study, shapes, "--plan")) == 2
        assert "holds a study with another definition (configs: " in capsys.readouterr().err
    finally:
        os.chdir(cwd)


def test_changed_cell_config_or_definition_is_refused(done_study, shapes, capsys) -> None:
    study, base = done_study
    text = base.read_text()
    stamp = (study / "plan.json").stat().st_mtime_ns
    try:
        base.write_text(text + "eval:\n  score_threshold: 0.4\n")
        assert main(study_args(base, study, shapes)) == 2
        err = capsys.readouterr().err.strip()
        assert "changed since it was started" in err and "eval.score_threshold: 0.5 -> 0.4" in err
        assert len(err.splitlines()) == 1
    finally:
        base.write_text(text)
    assert (
        main(
            [
                "study",
                "--config",
                str(base),
                "--grid",
                "model.position.name=sine,none",
                "--seeds",
                "2",
                *EVAL,
                "--output",
                str(study),
                *tiny_overrides(shapes),
            ]
        )
        == 2
    )
    assert "another definition" in capsys.readouterr().err
    assert (study / "plan.json").stat().st_mtime_ns == stamp


def test_a_failing_cell_is_recorded_and_the_others_run(tmp_path, shapes, capsys) -> None:
    base = write_base_config(tmp_path / "base.yaml")
    args = [
        "study",
        "--config",
        str(base),
        "--grid",
        "model.num_classes=1,null",
        "--output",
        str(tmp_path / "study"),
        *tiny_overrides(shapes),
        "train.max_iters=1",
        "train.eval_every_iters=0",
    ]
    assert main(args) == 3
    out = capsys.readouterr().out
    assert "study: 1 of 2 cells done, 1 failed (num_classes=1_seed0)" in out
    failed = json.loads((tmp_path / "study" / "cells" / "num_classes=1_seed0" / "cell.json").read_text())
    assert failed["status"] == "failed" and failed["error"].startswith("detr-peg train: error:")
    assert "num_classes" in failed["error"]
    assert (
        json.loads((tmp_path / "study" / "cells" / "num_classes=null_seed0" / "cell.json").read_text())["status"]
        == "done"
    )
    md = (tmp_path / "study" / "study.md").read_text()
    assert "## Cells not done" in md and failed["error"] in md


def test_plan_prints_the_commands_from_the_script(tmp_path, shapes) -> None:
    base = write_base_config(tmp_path / "base.yaml")
    env = python_env()
    argv = [sys.executable, str(REPO_ROOT / "tools" / "study.py"), *study_args(base, tmp_path / "s", shapes)[1:]]
    proc = subprocess.run([*argv, "--plan"], check=False, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line for line in lines if line.startswith("# cell")] == [f"# cell {name}" for name in CELLS]
    assert lines[1].startswith(f"detr-peg train --config {base} --output {tmp_path / 's'}/cells/")
    assert not (tmp_path / "s").exists()  # --plan runs nothing and writes nothing


def test_a_grid_value_the_config_refuses_stops_the_study_before_any_cell(tmp_path, shapes, capsys) -> None:
    base = write_base_config(tmp_path / "base.yaml")
    args = ["study", "--config", str(base), "--grid", "model.position.name=nonexistent,sine"]
    assert main([*args, "--output", str(tmp_path / "study"), *tiny_overrides(shapes)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'nonexistent'" in err and "model.position.name" in err
    assert not (tmp_path / "study" / "cells").exists()


def test_a_missing_dataset_stops_the_study_before_any_cell(tmp_path, monkeypatch, capsys) -> None:
    """The shipped proxy study, run where the synthetic dataset was never generated."""
    monkeypatch.chdir(tmp_path)
    study = REPO_ROOT / "configs" / "study" / "proxy_synthetic.yaml"
    assert main(["study", "--study", str(study), "--output", "s"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"detr-peg study: error: {REPO_ROOT / 'configs' / 'proxy' / 'deformable_small.yaml'}: data.train_images is "
        f"outputs/proxy_data/data/train, which is not an existing folder (relative paths are read from {tmp_path}); "
        "create the dataset first (the synthetic dataset: detr-peg demo --data-only --output outputs/proxy_data "
        "--num-train 2000 --num-val 1000)."
    )
    assert not (tmp_path / "s" / "cells").exists()


def test_plot_redraws_the_figures_and_tables_the_study_wrote(done_study, capsys) -> None:
    """``detr-peg plot STUDY`` replaces what ``detr-peg study`` wrote (the same kind of command), nothing else."""
    study, _ = done_study
    figures = sorted((study / "plots").glob("*.p*"))
    assert [f.name for f in figures] == sorted(figure_files(STUDY_FIGURES))
    before = {f: f.stat().st_mtime_ns for f in figures}
    table = (study / "study.md").read_text()
    assert main(["plot", str(study)]) == 0
    assert all(f.stat().st_mtime_ns > t for f, t in before.items())
    assert (study / "study.md").read_text() == table
    (study / "plots" / "notes.txt").write_text("mine")  # a file of the user's beside them is left alone
    assert main(["plot", str(study)]) == 0
    assert (study / "plots" / "notes.txt").read_text() == "mine"
