"""``detr-peg study --seeds auto``: rounds of seeds until every interval is narrow enough, or --max-seeds.

Only the step that trains and evaluates one cell is replaced (:func:`detr_peg.lab.study.runner.run_cell`): it
writes the files of a finished cell with known AP per seed, so the rounds, the stopping rule, the report
and the resuming are those of the real command.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from detr_peg.cli.main import main
from detr_peg.lab.study import runner
from detr_peg.lab.study.cell import CellOutcome, cell_paths, resolved_config
from tests.lab.study.conftest import write_base_config
from tests.lab.study.study_cells import write_done_cell

#: Per-seed difference peg - sine in AP points. The first three (sd 1.0) give a 95% half-width of 2.5, so
#: the next round is the projection for sd 1.0 and a target of 1.0: 7 seeds; those seven have sd 0.65 and
#: a half-width of 0.6.
NARROW = [2.0, 3.0, 1.0, 2.5, 1.5, 2.0, 2.0, 2.2, 1.8, 2.0]
#: A spread no sensible number of seeds narrows to 1 AP point.
WIDE = [3.0, -2.0, 4.0, -3.0, 1.0, -4.0, 2.0, -1.0, 5.0, -5.0]


def widest(study: Path) -> str:
    """The widest 95% half-width of the study's comparison rows, as the stop sentence writes it."""
    rows = json.loads((study / "study.json").read_text())["comparisons"]["rows"]
    return f"{max(r['half_width'] for r in rows if r['half_width'] is not None):.1f}"


class FakeCells:
    """Stands in for :func:`runner.run_cell`: writes the cell's files (AP of sine: a seed's level; peg: + diff)."""

    def __init__(self, diffs: list[float]) -> None:
        rng = np.random.default_rng(0)
        # What a seed does to both settings alike (initialisation, data order): pairing removes it.
        self.level = [0.30 + 0.05 * rng.standard_normal() for _ in diffs]
        self.diffs = diffs
        self.ran: list[str] = []
        self.interrupt: str | None = None

    def __call__(self, cell, paths, plan, run_command) -> CellOutcome:
        if cell.name == self.interrupt:
            self.interrupt = None
            return CellOutcome(cell.name, "interrupted", "stopped by SIGTERM", 143)
        self.ran.append(cell.name)
        diff = self.diffs[cell.seed] if dict(cell.values)["model.position.name"] == "peg" else 0.0
        ap = round(self.level[cell.seed] + diff / 100, 6)
        write_done_cell(paths.root.parent.parent, cell, {("val", None): ap}, resolved_config(cell))
        return CellOutcome(cell.name, "done", seconds=0.0)


@pytest.fixture
def study_args(tmp_path: Path):
    base = write_base_config(tmp_path / "base.yaml")
    data = tmp_path / "data"
    for folder in ("train", "val"):
        (data / folder).mkdir(parents=True)
        (data / f"{folder}.json").write_text("{}")

    def args(*extra: str) -> list[str]:
        return [
            "study",
            "--config",
            str(base),
            "--grid",
            "model.position.name=sine,peg",
            "--seeds",
            "auto",
            "--output",
            str(tmp_path / "study"),
            *extra,
            f"data.train_images={data / 'train'}",
            f"data.train_annotations={data / 'train.json'}",
            f"data.val_images={data / 'val'}",
            f"data.val_annotations={data / 'val.json'}",
        ]

    return args


def seeds_done(study: Path) -> list[int]:
    return sorted(int(p.name.rsplit("seed", 1)[1]) for p in (study / "cells").iterdir() if "peg" in p.name)


def test_rounds_stop_when_every_interval_is_within_the_target(study_args, tmp_path, monkeypatch, capsys) -> None:
    fake = FakeCells(NARROW)
    monkeypatch.setattr(runner, "run_cell", fake)
    assert main(study_args("--target-ci", "1.0")) == 0
    out = capsys.readouterr().out
    assert "round of 3 seeds per setting" in out and "round of 7 seeds per setting" in out
    assert "seeds auto stopped at 7 seeds per setting: all intervals within ±1.0 AP" in out
    study = tmp_path / "study"
    assert seeds_done(study) == list(range(7)) and len(fake.ran) == 14
    # Round 1 ran seeds 0-2 of both settings, round 2 only the new seeds 3-6.
    assert sorted(fake.ran[:6]) == sorted(f"position.name={s}_seed{i}" for s in ("sine", "peg") for i in range(3))
    results = json.loads((study / "study.json").read_text())
    (row,) = results["comparisons"]["rows"]
    assert row["n"] == 7 and row["half_width"] <= 1.0 and row["mean"] == pytest.approx(np.mean(NARROW[:7]))
    assert results["seeds_auto"]["target_ci"] == 1.0 and results["definition"]["seeds"] == 7
    md = (study / "study.md").read_text()
    assert (
        "Seeds: auto (target ±1.0 AP, at most 10 seeds); 7 seeds per setting; stopped: all intervals within ±1.0 AP."
        in md
    )
    plan = json.loads((study / "plan.json").read_text())
    assert plan["seeds_auto"]["max_seeds"] == 10 and plan["definition"]["seeds"] == 7

    # A rerun finds the study finished: nothing runs again.
    fake.ran.clear()
    assert main(study_args("--target-ci", "1.0")) == 0
    assert fake.ran == [] and "(14 already done)" in capsys.readouterr().out
    # detr-peg plot writes the same sentence from plan.json and the cells.
    assert main(["plot", str(study)]) == 0
    assert "stopped: all intervals within ±1.0 AP." in (study / "study.md").read_text()


def test_rounds_stop_at_max_seeds_and_a_rerun_continues_where_they_stopped(
    study_args, tmp_path, monkeypatch, capsys
) -> None:
    fake = FakeCells(WIDE)
    monkeypatch.setattr(runner, "run_cell", fake)
    assert main(study_args("--max-seeds", "5")) == 0
    out = capsys.readouterr().out
    assert "round of 3 seeds" in out and "round of 5 seeds" in out
    study = tmp_path / "study"
    # The sentence says how far from the target the maximum left the intervals (WIDE spreads them beyond it).
    reached = f"reached --max-seeds 5 with intervals up to ±{widest(study)} AP (target ±1.0)"
    assert float(widest(study)) > 1.0
    assert f"stopped at 5 seeds per setting: {reached}" in out
    assert seeds_done(study) == [0, 1, 2, 3, 4] and len(fake.ran) == 10
    assert f"5 seeds per setting; stopped: {reached}." in (study / "study.md").read_text()

    # A higher maximum continues from the 5 seeds done: only new seeds run; one is stopped by a signal.
    fake.ran.clear()
    fake.interrupt = "position.name=peg_seed6"
    assert main(study_args("--max-seeds", "8")) == 143
    # Cells run seed by seed: sine's and peg's seed 5, then sine's seed 6 before peg's 6 was stopped.
    assert fake.ran == ["position.name=sine_seed5", "position.name=peg_seed5", "position.name=sine_seed6"]
    # The report of a round under way says so, not what would have stopped it (peg's 6, both 7s are not done).
    md = (study / "study.md").read_text()
    assert "8 seeds per setting; this round is not finished (cells: 3 not started)." in md
    assert "stopped:" not in md
    capsys.readouterr()
    fake.ran.clear()
    assert main(study_args("--max-seeds", "8")) == 0
    assert fake.ran == [
        f"position.name={s}_seed{i}" for s, i in (("peg", 6), ("sine", 7), ("peg", 7))
    ]  # the rest was done
    assert seeds_done(study) == list(range(8))
    assert f"stopped at 8 seeds per setting: reached --max-seeds 8 with intervals up to ±{widest(study)} AP" in (
        capsys.readouterr().out
    )


def test_plan_prints_the_first_round_and_says_more_may_follow(study_args, tmp_path, capsys) -> None:
    assert main([*study_args("--max-seeds", "6"), "--plan"]) == 0
    out = capsys.readouterr().out
    cells = [line for line in out.splitlines() if line.startswith("# cell")]
    assert cells == [f"# cell position.name={s}_seed{i}" for s in ("sine", "peg") for i in range(3)]
    assert "# --seeds auto: the first round (3 seeds per setting); more rounds may follow, up to 6" in out
    assert not (tmp_path / "study").exists()


def test_options_of_seeds_auto_are_checked(study_args, tmp_path, capsys) -> None:
    args = study_args()
    fixed = [*args[: args.index("auto")], "2", *args[args.index("auto") + 1 :]]
    assert main([*fixed, "--target-ci", "0.5"]) == 2
    assert "--target-ci and --max-seeds go with --seeds auto" in capsys.readouterr().err
    assert main(study_args("--target-ci", "-1")) == 2
    assert "--target-ci must be a positive number" in capsys.readouterr().err
    assert main(study_args("--max-seeds", "1")) == 2  # refused by the option's type, as argparse does
    assert "--max-seeds: must be a whole number of at least 2" in capsys.readouterr().err
    single = [a.replace("sine,peg", "peg") for a in args]
    assert main(single) == 2
    assert "--seeds auto needs two settings or more" in capsys.readouterr().err


def test_a_study_file_sets_the_seed_rule_and_the_comparison(study_args, tmp_path, monkeypatch, capsys) -> None:
    fake = FakeCells(WIDE)
    monkeypatch.setattr(runner, "run_cell", fake)
    args = study_args()
    data = args[args.index(str(tmp_path / "study")) + 1 :]
    study_file = tmp_path / "study.yaml"
    study_file.write_text(
        "configs: [base.yaml]\n"
        "grid:\n  model.position.name: [sine, peg]\n"
        "seeds: auto\nmax_seeds: 4\ntarget_ci: 0.5\n"
        "baseline: model.position.name=peg\nequal_within: 2.0\n"
    )
    assert main(["study", "--study", str(study_file), "--output", str(tmp_path / "s"), *data]) == 0
    plan = json.loads((tmp_path / "s" / "plan.json").read_text())
    assert plan["seeds_auto"] == {"target_ci": 0.5, "max_seeds": 4, "first_round": 3}
    assert plan["comparison"] == {"baseline": "model.position.name=peg", "equal_within": 2.0}
    md = (tmp_path / "s" / "study.md").read_text()
    assert (
        "## Paired comparisons with model.position.name=peg" in md
        and "| position.name=sine | position.name=peg |" in md
    )
    assert (
        f"4 seeds per setting; stopped: reached --max-seeds 4 with intervals up to ±{widest(tmp_path / 's')} AP (target ±0.5)."
        in md
    )
    study_file.write_text(study_file.read_text().replace("equal_within: 2.0", "equal_within: -1"))
    assert main(["study", "--study", str(study_file), "--output", str(tmp_path / "s"), *data]) == 2
    assert "'equal_within' must be a positive number of AP points" in capsys.readouterr().err


def test_rounds_of_jobs_and_no_wait_continue_at_the_next_run(study_args, tmp_path, monkeypatch, capsys) -> None:
    """With jobs each round is submitted and waited for; --no-wait returns after a round, a rerun plans the next."""
    from types import SimpleNamespace

    from detr_peg.lab.study import slurm

    fake = FakeCells(NARROW)
    submitted: list[list[str]] = []

    def submit(study_dir, cells, plan, options, run_command):
        submitted.append([c.name for c in cells])
        for cell in cells:  # the jobs run at once here
            fake(cell, cell_paths(study_dir, cell), plan, run_command)
        return [SimpleNamespace(job_id=str(i)) for i, _ in enumerate(cells)]

    monkeypatch.setattr(slurm, "submit", submit)
    monkeypatch.setattr(
        slurm, "wait", lambda study_dir, jobs, cells, *a, **k: [CellOutcome(c.name, "done") for c in cells]
    )
    assert main(study_args("--submitit-local", "--no-wait")) == 0
    assert len(submitted) == 1 and len(submitted[0]) == 6  # the first round only
    assert "continues the study and plans the next round of seeds" in capsys.readouterr().out
    assert main(study_args("--submitit-local")) == 0
    assert [len(s) for s in submitted] == [6, 8]  # the rerun: seeds 3-6 of both settings, then stopped
    assert "stopped at 7 seeds per setting: all intervals within ±1.0 AP" in capsys.readouterr().out
