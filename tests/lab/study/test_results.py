"""Study results from cell files in the evaluation's formats: averages, tables of both kinds kept apart, plots."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import markdown
import pytest
from PIL import Image
from pymdownx.snippets import SnippetMissingError

from detr_peg.cli.main import main
from detr_peg.lab.study.cell import cell_paths, new_state, reported_status, write_state
from detr_peg.lab.study.grid import EvalPlan, StudyDefinition, expand_cells, parse_axis
from detr_peg.lab.study.plots import plot_study
from detr_peg.lab.study.results import SECTIONS, STATS, aggregate, collect, csv_rows, write_results
from detr_peg.lab.study.runner import plan_record
from detr_peg.lab.study.stored_files import PLAN_FILE, STUDY_FIGURES, figure_files
from detr_peg.outputs import HOLDER_FILE, OWNERSHIP_FILE
from tests.conftest import main_in_fresh_interpreter, run_python

STAT_NAMES = (*STATS, "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")


def stats(ap: float, unit: str = "fraction") -> dict[str, float]:
    """Twelve COCO numbers derived from one AP fraction (APl undefined: -1), as a file of ``unit`` holds them."""
    scale = 100.0 if unit == "percent" else 1.0
    return {name: (-1.0 if name == "APl" else round(scale * (ap + i / 100), 4)) for i, name in enumerate(STAT_NAMES)}


def fake_cell(study: Path, cell, ap: float, unit: str) -> None:
    """The files of a finished cell, in the formats of detr-peg train and detr-peg eval.

    ``unit="percent"``: the files of this version (``"unit": "percent"``);
    ``"fraction"``: files of earlier versions (fractions, no unit field).
    """
    tag = {"unit": "percent"} if unit == "percent" else {}

    def stats(value: float) -> dict[str, float]:
        return globals()["stats"](value, unit)

    paths = cell_paths(study, cell)
    paths.eval.mkdir(parents=True)
    paths.run.mkdir(parents=True)
    state = new_state(cell, {})
    state.update(status="done", stages={"train": "done", "eval": "done"})
    write_state(paths, state)
    (paths.eval / "metrics.json").write_text(json.dumps({"bbox": stats(ap), **tag, "num_images": 10}))
    for kind, name, shift in (("resized", "scales_resized.json", -0.1), ("canvas", "scales_canvas.json", -0.05)):
        results = [
            {"scale": s, "size": int(64 * s), "num_images": 10, "metrics": stats(ap + shift * (s - 1))}
            for s in (1.0, 1.5, 2.0)
        ]
        (paths.eval / name).write_text(json.dumps({"kind": kind, **tag, "base_size": 64, "results": results}))
    (paths.eval / "padding.json").write_text(
        json.dumps(
            {
                **tag,
                "modes": {
                    "mixed": {"batch_size": 8, "metrics": stats(ap - 0.01), "seconds": 1.0},
                    "single": {"batch_size": 1, "metrics": stats(ap), "seconds": 2.0},
                },
                "max_abs_logit_diff_mixed_vs_single": 0.25 * ap,
            }
        )
    )
    records = [
        {"type": "iter", "iteration": 1, "loss": 3.0},
        {"type": "eval", "iteration": 10, **stats(ap / 2), **tag},
        {"type": "eval", "iteration": 20, **stats(ap), **tag},
    ]
    (paths.run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(params=["percent", "fraction"])
def study(tmp_path: Path, request):
    """A finished two-setting study; its cells' files in percent (this version) or fractions (earlier ones)."""
    definition = StudyDefinition(
        configs=("base.yaml",),
        axes=(parse_axis("model.position.name=sine,peg"),),
        seeds=2,
        eval=EvalPlan(scales=(1.0, 1.5, 2.0), canvas_scales=(1.0, 1.5, 2.0), padding=True),
    )
    cells = expand_cells(definition)
    aps = {
        "position.name=sine_seed0": 0.30,
        "position.name=sine_seed1": 0.34,
        "position.name=peg_seed0": 0.40,
        "position.name=peg_seed1": 0.46,
    }
    for cell in cells:
        fake_cell(tmp_path, cell, aps[cell.name], request.param)
    (tmp_path / PLAN_FILE).write_text(json.dumps(plan_record(tmp_path, definition, cells)))
    return tmp_path, definition, cells


def test_aggregate_is_mean_and_sample_std_of_defined_values() -> None:
    agg = aggregate([0.3, 0.34, -1.0])
    assert agg["n"] == 2 and agg["values"] == [0.3, 0.34]
    assert math.isclose(agg["mean"], 0.32) and math.isclose(agg["std"], math.sqrt(2 * 0.02**2))
    assert aggregate([0.5])["std"] is None and aggregate([])["mean"] is None


def test_tables_hold_the_cells_numbers_with_both_kinds_apart(study) -> None:
    folder, definition, cells = study
    results = collect(folder, definition, cells)
    write_results(folder, results)
    peg = next(s for s in results["settings"] if s["setting"] == "position.name=peg")
    assert peg["seeds"] == [0, 1]
    # Every number in percent, whichever unit the cells' files hold.
    assert peg["main"]["AP"]["values"] == pytest.approx([40.0, 46.0]) and math.isclose(peg["main"]["AP"]["mean"], 43.0)
    assert peg["main"]["APl"]["n"] == 0  # COCO's -1 is not averaged
    resized = {r["scale"]: r for r in peg["resized"]}
    canvas = {r["scale"]: r for r in peg["canvas"]}
    assert resized[2.0]["AP"]["values"] == pytest.approx([30.0, 36.0])
    assert canvas[2.0]["AP"]["values"] == pytest.approx([35.0, 41.0])
    assert resized[2.0]["size"] == 128
    assert peg["padding"]["AP"]["mixed"]["values"] == pytest.approx([39.0, 45.0])
    assert peg["padding"]["max_abs_logit_diff_mixed_vs_single"] == pytest.approx(0.25 * 0.46)  # the largest
    assert [p["iteration"] for p in peg["curve"]] == [10, 20]
    assert peg["curve"][1]["values"] == pytest.approx([40.0, 46.0])

    md = (folder / "study.md").read_text()
    assert "| position.name=peg | 2 | 43.0 ± 4.2 | 44.0 ± 4.2 |" in md  # AP, AP50 (+1 point) in percent
    resized_part = md[md.index("## Test scales: resized") : md.index("## Test scales: larger canvas")]
    canvas_part = md[md.index("## Test scales: larger canvas") : md.index("## Padding")]
    assert "| position.name=peg | x2 | 128 | 2 | 33.0 ± 4.2 |" in resized_part
    assert "| position.name=peg | x2 | 128 | 2 | 38.0 ± 4.2 |" in canvas_part
    # What padding did to each cell (mixed - single, one point less in every cell): negative values are kept.
    assert "| setting | AP mixed | AP single | AP mixed - single | logit diff mixed vs single |" in md
    assert "| position.name=sine | 31.0 ± 2.8 | 32.0 ± 2.8 | -1.0 ± 0.0 | 0.085 |" in md
    assert peg["padding"]["AP"]["mixed - single"]["values"] == pytest.approx([-1.0, -1.0])

    with open(folder / "study.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows == [{k: "" if v is None else str(v) for k, v in r.items()} for r in csv_rows(results)]
    row = next(
        r
        for r in rows
        if r["setting"] == "position.name=peg" and r["kind"] == "canvas" and r["scale"] == "2.0" and r["metric"] == "AP"
    )
    assert [float(v) for v in row["values"].split(";")] == pytest.approx([35.0, 41.0]) and row["unit"] == "percent"
    written = json.loads((folder / "study.json").read_text())
    assert written["unit"] == "percent" and written["settings"][1]["main"]["AP"]["values"] == pytest.approx(
        [40.0, 46.0]
    )


def included(folder: Path, section: str) -> str:
    """The HTML of a documentation page that includes ``folder/study.md``'s named section, as the docs site does."""
    page = f'Before.\n\n--8<-- "study.md:{section}"\n\nAfter.\n'
    return markdown.markdown(
        page,
        extensions=["tables", "pymdownx.snippets"],
        extension_configs={"pymdownx.snippets": {"base_path": [str(folder)], "check_paths": True}},
    )


def test_a_documentation_page_includes_each_table_of_the_report_by_name(study) -> None:
    folder, definition, cells = study
    results = collect(folder, definition, cells)
    write_results(folder, results)
    # Section -> (first header cells, rows below the header, a cell of one of them: peg - sine at AP is
    # (40 - 30 + 46 - 34) / 2 = +11.00 points, peg's AP 43.0 ± 4.2 and 33.0 ± 4.2 resized at x2, ...).
    tables = {
        "comparisons": (["setting", "reference", "metric"], len(results["comparisons"]["rows"]), "<td>+11.00</td>"),
        "validation": (["setting", "n", "AP"], 2, "<td>43.0 ± 4.2</td>"),
        "resized": (["setting", "scale", "size"], 6, "<td>33.0 ± 4.2</td>"),
        "canvas": (["setting", "scale", "size"], 6, "<td>38.0 ± 4.2</td>"),
        "padding": (["setting", "AP mixed", "AP single"], 2, "<td>31.0 ± 2.8</td>"),
    }
    assert set(tables) | {"cost", "progress"} == set(SECTIONS)  # the cost table: test_cost_per_cell_...
    # The progress lines are a paragraph of their own: what the report's first lines say, nothing more.
    assert included(folder, "progress") == "<p>Before.</p>\n<p>Cells: 4 of 4 cells done.</p>\n<p>After.</p>"
    for name, (header, n_rows, cell) in tables.items():
        html = included(folder, name)
        assert html.startswith("<p>Before.</p>") and html.endswith("<p>After.</p>")
        assert html.count("<table>") == 1 and "--8&lt;--" not in html and "--8<--" not in html
        assert re.findall(r"<th>(.*?)</th>", html)[: len(header)] == header
        assert html.count("<tr>") == 1 + n_rows and cell in html
    assert "<td>33.0 ± 4.2</td>" not in included(folder, "canvas")  # each section holds its own table only
    with pytest.raises(SnippetMissingError):
        included(folder, "no_such_table")


@pytest.mark.parametrize("study", ["percent"], indirect=True)  # counts, not values: one unit is enough
def test_the_report_and_the_plot_command_count_the_cells_by_status(study, capsys) -> None:
    folder, definition, cells = study
    assert main(["plot", str(folder)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"Study {folder}: 4 of 4 cells done."
    # One cell was started and stopped without a word, another failed, a third never started.
    for cell, status in zip(cells[1:], ("running", "failed", None)):
        paths = cell_paths(folder, cell)
        if status is None:
            (paths.state).unlink()
        else:
            write_state(paths, {**new_state(cell, {}), "status": status, "error": "exit status 1"})
    (folder / "study.json").unlink()  # the report had them done: a redraw would refuse to drop them
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    here = socket.gethostname()
    holder = cell_paths(folder, cells[1]).run / HOLDER_FILE
    # The cell recorded as running is running while a live process holds its run folder (or one on a machine
    # that cannot be asked), and stopped when no process holds it or the one that did is gone.
    for holders, word in (
        (None, "stopped"),
        ({"pid": os.getpid(), "host": here}, "running"),
        ({"pid": int(gone.stdout), "host": f"{here}-elsewhere"}, "running"),
        ({"pid": int(gone.stdout), "host": here}, "stopped"),
    ):
        if holders is not None:
            holder.write_text(json.dumps({**holders, "command": "train", "since": "2026-01-01 00:00:00"}))
        assert main(["plot", str(folder)]) == 0
        line = f"1 of 4 cells done; 1 {word}, 1 failed, 1 not started"
        assert capsys.readouterr().out.splitlines()[-1] == f"Study {folder}: {line}."
        assert f"Cells: {line}." in (folder / "study.md").read_text().splitlines()


def test_a_cell_between_its_commands_is_running_while_a_study_holds_its_folder(study) -> None:
    folder, definition, cells = study
    paths = cell_paths(folder, cells[0])
    assert reported_status({"status": "running"}, paths, folder) == "stopped"
    for command, word in (("study", "running"), ("plot", "stopped")):  # a plot of the study holds it too
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "since": "2026-01-01 00:00:00"}
        (folder / HOLDER_FILE).write_text(json.dumps(holder))
        assert reported_status({"status": "running"}, paths, folder) == word
    assert reported_status({"status": "failed"}, paths, folder) == "failed"
    assert reported_status({}, paths, folder) == "not started"


def test_plots_are_drawn_and_redrawn_by_the_plot_command(study) -> None:
    folder, definition, cells = study
    files = plot_study(folder, collect(folder, definition, cells))
    assert sorted(p.name for p in files) == sorted(figure_files(STUDY_FIGURES))
    with Image.open(folder / "plots" / "ap_vs_scale.png") as image:
        assert image.width > image.height  # two panels side by side: resized | larger canvas
    for f in files:
        f.unlink()
    assert main(["plot", str(folder)]) == 0
    assert all(f.is_file() for f in files) and (folder / "study.md").is_file()


@pytest.mark.parametrize("study", ["percent"], indirect=True)
def test_plot_of_a_study_imports_neither_torch_nor_the_models(study) -> None:
    """The report and figures come from JSON files: a fresh ``detr-peg plot`` starts in seconds, without torch."""
    folder = study[0]
    proc, probe = main_in_fresh_interpreter("plot", str(folder))
    assert probe == {"status": 0, "heavy": []}, proc.stderr[-2000:]
    assert f"Study {folder}: 4 of 4 cells done." in proc.stdout
    assert (folder / "study.md").is_file() and (folder / "plots" / "ap_vs_scale.png").is_file()


def test_a_figure_the_results_no_longer_give_is_removed_on_redraw(study) -> None:
    folder, definition, cells = study
    plots = folder / "plots"
    assert main(["plot", str(folder)]) == 0

    def figures() -> list[str]:
        return sorted(p.name for p in plots.iterdir() if p.name != OWNERSHIP_FILE)

    assert figures() == sorted(figure_files(STUDY_FIGURES))
    # The runs' logs now hold one evaluation each (at the end): no learning curve is left to draw.
    for cell in cells:
        log = cell_paths(folder, cell).run / "metrics.jsonl"
        records = [json.loads(line) for line in log.read_text().splitlines()]
        log.write_text("".join(json.dumps(r) + "\n" for r in records if r.get("iteration") != 10))
    assert main(["plot", str(folder)]) == 0
    remaining = [f for f in STUDY_FIGURES if f != "learning_curves"]
    assert figures() == sorted(figure_files(remaining))


def test_plot_of_a_single_run_and_of_something_else(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        json.dumps({"type": "eval", "iteration": 5, **stats(0.2)})
        + "\n"
        + json.dumps({"type": "iter", "iteration": 5, "loss": 2.5})
        + "\n"
    )
    assert main(["plot", str(run)]) == 0
    with Image.open(run / "plots" / "learning_curve.png") as image:
        assert image.format == "PNG"
    for options in (["--equal-within", "nan"], ["--baseline", "model.position.name=peg"]):  # a study's, not a run's
        assert main(["plot", str(run), *options]) == 2
        assert f"{options[0]} go with a study folder; {run} has no plan.json." in capsys.readouterr().err
    assert main(["plot", str(tmp_path)]) == 2
    assert "neither a study folder" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert f"RUN_OR_STUDY {tmp_path / 'missing'} does not exist" in capsys.readouterr().err
    assert main(["plot", str(run / "metrics.jsonl")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    (run / "metrics.jsonl").write_bytes(b'{"type": "iter", "note": "\xff\xfe"}\n')  # not UTF-8
    assert main(["plot", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"detr-peg plot: error: {run / 'metrics.jsonl'} is not UTF-8 text, as the metrics.jsonl of detr-peg train is; nothing to plot."
    ]


def test_plot_draws_with_agg_whatever_matplotlib_backend_is_set(tmp_path: Path) -> None:
    """matplotlib refuses an unknown ``MPLBACKEND`` when imported, before plot could choose Agg."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"type": "iter", "iteration": 5, "loss": 2.5}) + "\n")
    for backend in ("bogus", "TkAgg"):
        result = run_python("-m", "detr_peg.cli.main", "plot", str(run), MPLBACKEND=backend)
        assert result.returncode == 0 and not result.stderr, result.stderr[-2000:]
        assert result.stdout.splitlines()[-1] == f"Wrote {run / 'plots' / 'learning_curve.png'}"


def test_cost_per_cell_is_read_from_the_run_logs_resumed_segments_summed(study) -> None:
    folder, definition, cells = study
    # The sine cells' runs log their iterations' times: seed 0 ran in two segments (stopped after iteration 40,
    # resumed 1000 s later), seed 1 in one. A line that is not an object and a line being written at the end are
    # skipped.
    runs = {
        "position.name=sine_seed0": [
            [(0.0, None), (10.0, 0.5), (20.0, 0.7), (30.0, 0.6)],
            [(1030.0, None), (1040.0, 0.9), (1090.0, 0.4)],
        ],
        "position.name=sine_seed1": [[(0.0, None), (10.0, 0.2), (70.0, 0.3), (130.0, 0.4)]],
    }
    expected = {}
    for name, segments in runs.items():
        cell = next(c for c in cells if c.name == name)
        lines, iteration, times = [], 0, []
        for segment in segments:
            for at, iter_time in segment:
                if iter_time is None:
                    lines.append({"type": "start", "time": at})
                else:
                    iteration += 20
                    times.append(iter_time)
                    lines.append({"type": "iter", "iteration": iteration, "iter_time": iter_time, "time": at})
        if name.endswith("seed1"):  # a run that ends between two logged iterations: its end record counts them
            iteration += 7
            lines.append({"type": "end", "iterations": iteration, "time": segments[-1][-1][0]})
        text = "[1, 2]\n" + "".join(json.dumps(r) + "\n" for r in lines) + '{"type": "iter", "iter'
        (cell_paths(folder, cell).run / "metrics.jsonl").write_text(text)
        wall = sum(s[-1][0] - s[0][0] for s in segments) / 60
        expected[name] = {"iterations": iteration, "iter_seconds": statistics.median(times), "wall_minutes": wall}

    results = collect(folder, definition, cells)
    for record in results["cells"]:
        if record["name"] in expected:
            assert record["cost"] == pytest.approx(expected[record["name"]])
        else:
            assert record["cost"] is None  # its log has no iteration times
    sine = next(s for s in results["settings"] if s["setting"] == "position.name=sine")
    seconds = [expected[n]["iter_seconds"] for n in sorted(expected)]
    walls = [expected[n]["wall_minutes"] for n in sorted(expected)]
    assert sine["cost"]["iter_seconds"]["values"] == pytest.approx(seconds)
    assert sine["cost"]["wall_minutes"]["std"] == pytest.approx(statistics.stdev(walls))

    write_results(folder, results)
    md = (folder / "study.md").read_text()
    table = md[md.index("## Cost per cell") :]
    row = (
        f"| position.name=sine | 2 | {statistics.mean(e['iterations'] for e in expected.values()):.0f} | "
        f"{statistics.mean(seconds):.3f} ± {statistics.stdev(seconds):.3f} | "
        f"{statistics.mean(walls):.1f} ± {statistics.stdev(walls):.1f} |"
    )
    assert row in table.splitlines()
    assert "position.name=peg" not in table  # no cell of it logged its times
    html = included(folder, "cost")
    assert html.count("<tr>") == 2 and f"<td>{statistics.mean(walls):.1f} ± {statistics.stdev(walls):.1f}</td>" in html
