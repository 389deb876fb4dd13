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

import pytest
from PIL import Image
from scipy import stats

from detr_peg.lab.study.comparisons import row_title
from detr_peg.lab.study.grid import EvalPlan, StudyDefinition, expand_cells, parse_axis
from detr_peg.lab.study.plots import (
    STUDY_FIGURES,
    axis_name,
    figure_ap_vs_scale,
    figure_comparisons,
    figure_files,
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
from detr_peg.lab.study.stored_files import PLAN_FILE
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
    assert titles == [
        "detr_small: AP vs test scale, resized",
        "detr_small: AP vs test scale, larger canvas",
        "deformable_small: AP vs test scale, resized",
        "deformable_small: AP vs test scale, larger canvas",
    ]
    for ax in axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "1.5", "2"]
        assert list(ax.get_xticks()) == [1.0, 1.5, 2.0]
        lines = [c.lines[0] for c in ax.containers]
        assert [c.get_label() for c in ax.containers] == ["sine", "peg"]
        assert len({line.get_marker() for line in lines}) == len({line.get_linestyle() for line in lines}) == 2
        assert len({line.get_color() for line in lines}) == 2
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["sine", "peg"]  # one legend, outside the panels
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
        "detr_small: validation AP during training",
        "deformable_small: validation AP during training",
    ]
    assert all(ax.get_ylabel() == "AP (%)" for ax in curves.axes)
    assert curves.legends[0].get_title().get_text() == "position"
    bars_fig = figure_main_metrics(res["settings"])
    ax = bars_fig.axes[0]
    assert ax.get_title() == "detr_small: AP, AP50, AP75 at the validation size"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["AP", "AP50", "AP75"]
    sine, peg = ax.containers[1], ax.containers[3]  # an ErrorbarContainer, then a BarContainer, per series
    assert (sine.get_label(), peg.get_label()) == ("sine", "peg")
    assert sine.patches[0].get_hatch() != peg.patches[0].get_hatch()
    assert sine.patches[0].get_facecolor() != peg.patches[0].get_facecolor()


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
    assert [ax.get_title() for ax in fig.axes] == ["deformable_small: validation AP during training"]
    (series,) = fig.axes[0].containers  # one error-bar series
    assert series.get_label() == series_label(keep)
    assert series.lines[0].get_xdata().tolist() == [p["iteration"] for p in keep["curve"]]


def test_forest_plot_shows_each_comparison_with_the_reports_interval_and_seeds(results) -> None:
    _, res = results
    fig = figure_comparisons(res["comparisons"], res["settings"])
    rows = res["comparisons"]["rows"]
    # One panel per model, in the report's order, with that model's rows top down.
    panels = {"detr_small": [], "deformable_small": []}
    for row in rows:
        panels[row["setting"].split("_position")[0]].append(row)
    assert [ax.get_title() for ax in fig.axes] == [f"{m}: AP, each setting minus position=sine" for m in panels]
    assert all(len(group) for group in panels.values())
    for ax, group in zip(fig.axes, panels.values()):
        ticks = sorted(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())), reverse=True)
        labels = [text for _, text in ticks]
        assert labels == [f"{r['setting'].split('=')[1]} - sine, {row_title(r)}" for r in group]
        for container, row in zip(ax.containers, group):
            ((low, high),) = bars(container, horizontal=True)
            assert (low, high) == pytest.approx(tuple(row["ci"]))
            assert container.lines[0].get_xdata().tolist() == pytest.approx([row["mean"]])
        # Each row's seed-by-seed differences, drawn on its line (the report's values, three seeds here).
        seeds = [line for line in ax.lines if line.get_label() == "one seed"]
        assert len(seeds) == len(group)
        for line, row, y in zip(seeds, group, sorted(ax.get_yticks(), reverse=True)):
            assert line.get_xdata().tolist() == pytest.approx(row["differences"])
            assert set(line.get_ydata().tolist()) == {y}
        texts = [t.get_text().strip() for t in ax.texts]
        assert texts == [r["verdict"] if r["verdict"] != "equal" else "equal within ±1.0 AP" for r in group]
    # The fake cells' AP is the same at x1 of both kinds and one image at a time: one row, named after "=".
    first = sorted(zip(fig.axes[0].get_yticks(), fig.axes[0].get_yticklabels()), key=lambda t: -t[0])[0][1]
    assert first.get_text() == "peg - sine, AP (= resized x1, canvas x1, padding single)"
    assert any(t.get_text() == "peg - sine, AP resized x2" for t in fig.axes[1].get_yticklabels())
    # AP differences computed here from the cells' values (fractions in the files, points in the report).
    detr = panels["detr_small"][0]
    expected = [100 * (p - s) for p, s in zip(AP[("detr_small", "peg")], AP[("detr_small", "sine")])]
    assert detr["differences"] == pytest.approx(expected)
    assert fig.axes[-1].get_xlabel() == "difference in AP points (mean and 95% interval over 3 paired seeds)"
    assert fig.axes[0].get_xlabel() == ""  # the shared axis is named once, under the last panel


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
        ("model.position.name=sine", "position=sine"),
        ("train.ema_decay=0.0", "ema_decay=0.0"),
        ("config=configs/proxy/detr_small.yaml", "detr_small"),
        (None, "the reference"),
    ],
)
def test_the_reference_is_named_shortly_in_titles(baseline, short) -> None:
    assert short_setting(baseline) == short
