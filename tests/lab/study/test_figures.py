"""The study's figures as a paper needs them, read back from the matplotlib figures and the files.

A study of two base configs (two models) x two encodings x three seeds, its
cells written by the test; the figures are checked for what they show: short
labels, the model and the metric in every title, ticks at the measured
scales, a colour, a marker and a line style per series, 95% intervals over
seeds as error bars (computed here with scipy), the forest plot's panels
(one per model), intervals and per-seed differences equal to the report's,
and both a vector PDF and a 300 dpi PNG of each.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import stats

from detr_peg.lab.study.grid import EvalPlan, StudyDefinition, expand_cells, parse_axis
from detr_peg.lab.study.plots import (
    ENCODING_STYLES,
    VERDICT_MARKS,
    axis_name,
    figure_ap_vs_scale,
    figure_comparisons,
    figure_confusion,
    figure_learning_curves,
    figure_main_metrics,
    legend_title,
    plot_run,
    plot_study,
    series_label,
    short_setting,
)
from detr_peg.lab.study.results import collect
from detr_peg.lab.study.runner import plan_record
from detr_peg.lab.study.stored_files import PLAN_FILE, RUN_FIGURES, STUDY_FIGURES, figure_files
from tests.lab.study.test_results import fake_cell

AP = {  # (config, encoding) -> AP per seed (fractions, as fake_cell writes them)
    ("detr_small", "sine"): [0.30, 0.34, 0.29],
    ("detr_small", "peg"): [0.40, 0.46, 0.41],
    ("deformable_small", "sine"): [0.50, 0.52, 0.47],
    ("deformable_small", "peg"): [0.49, 0.55, 0.50],
}


@pytest.fixture
def results(tmp_path: Path):
    configs = []
    for name in ("detr_small", "deformable_small"):
        (tmp_path / f"{name}.yaml").write_text("model:\n  arch: detr\n")
        configs.append(str(tmp_path / f"{name}.yaml"))
    definition = StudyDefinition(
        configs=tuple(configs),
        axes=(parse_axis("model.position.name=sine,peg"),),
        seeds=3,
        eval=EvalPlan(scales=(1.0, 1.5, 2.0), canvas_scales=(1.0, 1.5, 2.0), padding=True),
    )
    cells = expand_cells(definition)
    for cell in cells:
        fake_cell(tmp_path, cell, AP[(Path(cell.config).stem, cell.values[0][1])][cell.seed], "percent")
    (tmp_path / PLAN_FILE).write_text(json.dumps(plan_record(tmp_path, definition, cells)))
    return tmp_path, collect(tmp_path, definition, cells)


def half_width(values: list[float]) -> float:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)


def bars(container, horizontal: bool = False) -> list[tuple[float, float]]:
    """The (low, high) ends of an errorbar container's bars (vertical, or horizontal as in the forest plot)."""
    (collection,) = container.lines[2]
    return [(x0, x1) if horizontal else (y0, y1) for (x0, y0), (x1, y1) in collection.get_segments()]


def test_ap_vs_scale_has_a_panel_per_model_and_kind_with_readable_series(results) -> None:
    _, res = results
    fig = figure_ap_vs_scale(res["settings"])
    axes = fig.axes
    assert len(axes) == 4  # 2 models x (resized, canvas)
    titles = [ax.get_title() for ax in axes]
    assert titles == [  # names a reader knows
        "DETR (small), resized",
        "DETR (small), larger canvas",
        "Deformable-DETR (small), resized",
        "Deformable-DETR (small), larger canvas",
    ]
    for ax in axes:
        # Sizes in pixels (the fake validation size is 64 px), not scale factors.
        assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "96", "128"]
        assert "px" in ax.get_xlabel()
        lines = [c.lines[0] for c in ax.containers]
        assert [c.get_label() for c in ax.containers] == ["sine", "PEG"]
        assert len({line.get_marker() for line in lines}) == 2
        # One fixed colour per encoding, the same in every figure; points, not lines joining distinct sizes.
        assert [line.get_color() for line in lines] == [
            ENCODING_STYLES["sine"]["color"],
            ENCODING_STYLES["peg"]["color"],
        ]
        assert {line.get_linestyle() for line in lines} == {"None"}
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["sine", "PEG"]  # one legend, outside the panels
    assert fig.legends[0].get_title().get_text() == "position"  # what the labels are values of
    # The error bar at x1 of detr_small / peg is the 95% t-interval of its three seeds (percent).
    seeds = [100 * v for v in AP[("detr_small", "peg")]]
    low, high = bars(axes[0].containers[1])[0]
    assert (high - low) / 2 == pytest.approx(half_width(seeds))
    assert (high + low) / 2 == pytest.approx(sum(seeds) / 3)


def test_curves_and_bars_name_the_model_and_metric(results) -> None:
    _, res = results
    curves = figure_learning_curves(res["settings"])
    assert [ax.get_title() for ax in curves.axes] == [
        "DETR (small): validation AP during training",
        "Deformable-DETR (small): validation AP during training",
    ]
    assert all(ax.get_ylabel() == "AP (%)" for ax in curves.axes)
    assert curves.legends[0].get_title().get_text() == "position"
    points = figure_main_metrics(res["settings"])
    # A panel per model and metric, each with its own axis: points with intervals, no bars from zero.
    assert [ax.get_title() for ax in points.axes] == ["AP", "AP50", "AP75"] * 2
    ax = points.axes[0]
    assert ax.get_ylabel().startswith("DETR (small)")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["sine", "PEG"]
    assert not ax.patches
    sine, peg = ax.containers
    assert (sine.get_label(), peg.get_label()) == ("sine", "PEG")
    seeds = [100 * v for v in AP[("detr_small", "peg")]]
    assert peg.lines[0].get_ydata().tolist() == pytest.approx([sum(seeds) / 3])


def test_learning_curves_need_two_evaluations(results) -> None:
    # Cells that evaluate once, at the end of training, give a setting one point: no curve to draw.
    _, res = results
    settings = copy.deepcopy(res["settings"])
    assert all(len(e["curve"]) > 1 for e in settings)
    for e in settings:
        e["curve"] = e["curve"][-1:]
    assert figure_learning_curves(settings) is None
    # One setting with a curve: its model gets the only panel, with that setting's line alone.
    keep = next(e for e in res["settings"] if e["setting"].startswith("deformable_small"))
    next(e for e in settings if e["setting"] == keep["setting"])["curve"] = keep["curve"]
    fig = figure_learning_curves(settings)
    assert [ax.get_title() for ax in fig.axes] == ["Deformable-DETR (small): validation AP during training"]
    (series,) = fig.axes[0].containers  # one error-bar series
    assert series.get_label() == series_label(keep)
    assert series.lines[0].get_xdata().tolist() == [p["iteration"] for p in keep["curve"]]


def test_forest_plot_shows_each_comparison_with_the_reports_interval_and_seeds(results) -> None:
    _, res = results
    fig = figure_comparisons(res["comparisons"], res["settings"])
    rows = res["comparisons"]["rows"]
    # A column per model and a row of panels per family of rows, each panel with its own x axis.
    families = {"val": "test size", "resized": "test size", "canvas": "larger canvas", "padding": "padded batches"}
    models = {"detr_small": "DETR (small)", "deformable_small": "Deformable-DETR (small)"}
    panels: dict[str, list] = {}
    for row in rows:
        model = models[row["setting"].split("_position")[0]]
        panels.setdefault(f"{model}: {families[row['kind']]}, AP minus sine", []).append(row)
    drawn = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert set(drawn) == set(panels)
    assert len({tuple(ax.get_xlim()) for ax in drawn.values()}) > 1  # not one shared axis
    for title, group in panels.items():
        ax = drawn[title]
        group = sorted(group, key=lambda r: (r["setting"], r.get("scale") or 1.0))
        ticks = sorted(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())), reverse=True)
        expected = {  # rows in size order, sizes in pixels (the fake validation size is 64 px)
            "test size": ["PEG - sine, AP at 64 px", "PEG - sine, AP at 96 px", "PEG - sine, AP at 128 px"],
            "larger canvas": ["PEG - sine, AP at 96 px"],
            "padded batches": ["PEG - sine, AP padding mixed", "PEG - sine, AP padding mixed - single"],
        }
        assert [text for _, text in ticks] == expected[title.split(": ")[1].split(",")[0]]
        by_mean = {round(r["mean"], 9): r for r in group}
        for container in ax.containers:
            mean = container.lines[0].get_xdata().tolist()[0]
            row = by_mean[round(mean, 9)]
            ((low, high),) = bars(container, horizontal=True)
            assert (low, high) == pytest.approx(tuple(row["ci"]))
            assert container.lines[0].get_color() == VERDICT_MARKS[row["verdict"]][0]  # one colour per verdict
        # Each row's seed-by-seed differences, drawn on its line (the report's values, three seeds here).
        seeds = [line.get_xdata().tolist() for line in ax.lines if line.get_label() == "one seed"]
        assert sorted(map(sorted, seeds)) == sorted(sorted(r["differences"]) for r in group)
        assert sorted(t.get_text().strip() for t in ax.texts) == sorted(r["verdict"] for r in group)
    # AP differences computed here from the cells' values (fractions in the files, points in the report).
    detr = next(r for r in rows if r["setting"].startswith("detr_small"))
    expected = [100 * (p - s) for p, s in zip(AP[("detr_small", "peg")], AP[("detr_small", "sine")])]
    assert detr["differences"] == pytest.approx(expected)


def test_every_figure_is_written_as_pdf_and_300_dpi_png(results) -> None:
    folder, res = results
    files = plot_study(folder, res)
    assert sorted(f.name for f in files) == sorted(figure_files(STUDY_FIGURES))
    for f in files:
        if f.suffix == ".pdf":
            assert f.read_bytes()[:5] == b"%PDF-"
        else:
            with Image.open(f) as image:
                assert image.format == "PNG"
                assert image.info["dpi"] == pytest.approx((300, 300), abs=0.01)
    run = folder / "cells" / next(p.name for p in (folder / "cells").iterdir()) / "run"
    assert sorted(p.name for p in plot_run(run)) == ["learning_curve.pdf", "learning_curve.png"]


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("model.position.name", "position"),
        ("train.ema_decay", "ema_decay"),
        ("model.position.peg_layers", "position.peg_layers"),
        ("seed", "seed"),
    ],
)
def test_legend_titles_name_the_axis_without_its_section(key: str, name: str) -> None:
    assert axis_name(key) == name
    settings = [{"values": {key: "a"}}, {"values": {key: "b", "train.lr": "1e-4"}}]
    assert legend_title(settings) == f"{name}, lr"


@pytest.mark.parametrize(
    ("baseline", "short"),
    [
        ("model.position.name=sine", "sine"),
        ("model.position.name=peg", "PEG"),
        ("train.ema_decay=0.0", "ema_decay=0.0"),
        ("config=configs/proxy/detr_small.yaml", "DETR (small)"),
        (None, "the reference"),
    ],
)
def test_the_reference_is_named_shortly_in_titles(baseline, short) -> None:
    assert short_setting(baseline) == short


def test_a_run_is_drawn_with_its_confusion_matrix_and_names_stay_text(tmp_path: Path) -> None:
    """Names and folders with TeX in them (``$\\foo$``) are drawn as written, not parsed as math."""
    run = tmp_path / "run$\\foo$x"
    run.mkdir()
    records = [{"type": "iter", "iteration": i, "loss": 3.0 / i} for i in (1, 2)] + [
        {"type": "eval", "iteration": 2, "bbox": {"AP": 1.0, "AP50": 2.0}}
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    matrix = {"iou": 0.5, "score_threshold": 0.3, "names": ["$\\foo$", "cat", "background"],
              "counts": [[3, 0, 1], [0, 0, 0], [2, 0, 0]]}  # fmt: skip
    (run / "confusion_matrix.json").write_text(json.dumps(matrix))
    files = plot_run(run)
    assert sorted(p.name for p in files) == sorted(figure_files(RUN_FIGURES))
    fig = figure_confusion(matrix, run.name)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["$\\foo$", "background"]  # cat: no ground truth and no detection
    shares = fig.axes[0].images[0].get_array()
    np.testing.assert_allclose(shares, [[0.75, 0.25], [1.0, 0.0]])


def test_long_class_names_are_shortened_so_the_canvas_stays_bounded(tmp_path: Path) -> None:
    """``bbox_inches="tight"`` grows the canvas to fit tick labels: a 2,000-character name made a 35k x 35k PNG."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"type": "iter", "iteration": 1, "loss": 1.0}) + "\n")
    long = "x" * 1000 + "y" * 1000
    matrix = {"iou": 0.5, "score_threshold": 0.3, "names": [long, "background"], "counts": [[3, 1], [2, 0]]}
    (run / "confusion_matrix.json").write_text(json.dumps(matrix))
    labels = [t.get_text() for t in figure_confusion(matrix, run.name).axes[0].get_yticklabels()]
    assert labels == [f"{'x' * 20}...{'y' * 20} (2000 characters)", "background"]
    plot_run(run)
    with Image.open(run / "plots" / "confusion_matrix.png") as image:
        assert max(image.size) < 3000, image.size
    empty = {**matrix, "counts": [[0, 0], [0, 0]]}  # negative images only, nothing detected: no row to draw
    assert figure_confusion(empty, run.name).axes[0].get_yticklabels() == []
