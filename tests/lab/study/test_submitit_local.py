"""The cluster path of ``detr-peg study``: one submitit job per cell, run by submitit's LocalExecutor (no SLURM)."""

from __future__ import annotations

import json

import pytest

from detr_peg.cli.main import main
from tests.lab.study.conftest import tiny_overrides, write_base_config


@pytest.mark.slow  # two job processes, each importing torch and training
def test_two_cell_study_through_submitit_local_jobs_completes_with_tables(tmp_path, shapes, capsys) -> None:
    base = write_base_config(tmp_path / "base.yaml")
    study = tmp_path / "study"
    # The larger-canvas set is generated once before the jobs start, not by each job.
    args = [
        "study",
        "--config",
        str(base),
        "--grid",
        "model.position.name=sine,peg",
        "--output",
        str(study),
        "--submitit-local",
        "--gpus-per-node",
        "1",
        "--time",
        "10",
        "--canvas-scales",
        "1.5",
        *tiny_overrides(shapes),
        "train.max_iters=1",
        "train.eval_every_iters=0",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "submitted 2 jobs" in out and "study: 2 of 2 cells done" in out
    results_files = list((study / "jobs").glob("*/*_result.pkl"))
    assert len({f.parent for f in results_files}) == 2  # each cell ran as its own job
    results = json.loads((study / "study.json").read_text())
    for name in ("sine", "peg"):
        cell = study / "cells" / f"position.name={name}_seed0"
        assert json.loads((cell / "cell.json").read_text())["status"] == "done"
        own = json.loads((cell / "run" / "metrics.json").read_text())["bbox"]
        entry = next(s for s in results["settings"] if s["setting"] == f"position.name={name}")
        assert entry["main"]["AP"]["values"] == [own["AP"]]
        canvas = json.loads((cell / "eval" / "scales_canvas.json").read_text())["results"]
        assert entry["canvas"][0]["AP"]["values"] == [m for m in [canvas[0]["metrics"]["AP"]] if m >= 0]
    assert (study / "study.md").is_file() and (study / "plots" / "main_metrics.pdf").is_file()

    # A second submission finds everything done and submits nothing.
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "(2 already done)" in out and "submitted" not in out


def test_cluster_jobs_are_submitted_seed_by_seed(tmp_path, shapes, monkeypatch) -> None:
    # As cells run here (tests/lab/study/test_grid.py): a cluster that runs the first jobs first gives whole seeds.
    from detr_peg.lab.study import slurm

    class Submitted(Exception):
        pass

    order: list[str] = []

    def submit(study_dir, cells, plan, cluster, run_command):
        order.extend(cell.name for cell in cells)
        raise Submitted

    monkeypatch.setattr(slurm, "submit", submit)
    base = write_base_config(tmp_path / "base.yaml")
    args = ["study", "--config", str(base), "--grid", "model.position.name=sine,peg", "--seeds", "2"]
    with pytest.raises(Submitted):
        main([*args, "--submitit-local", "--output", str(tmp_path / "study"), *tiny_overrides(shapes)])
    assert order == [f"position.name={name}_seed{seed}" for seed in (0, 1) for name in ("sine", "peg")]
