"""The figures of a study (``STUDY/plots/``) and of a run (``RUN/plots/learning_curve``), as PDF and 300 dpi PNG.

Error bars are 95% t intervals of the mean over seeds (none below two seeds).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scipy import stats as scipy_stats

from detr_peg.errors import ConfigError, DataError
from detr_peg.fileio.atomic import save_figure
from detr_peg.fileio.os_errors import make_folder, writing
from detr_peg.messages import install_hint

try:
    import matplotlib
except ImportError:
    raise ConfigError(f"Plots need matplotlib: {install_hint('matplotlib')}.") from None

matplotlib.use("Agg")  # files only: no display, safe in jobs and tests
import matplotlib.pyplot as plt  # after choosing the backend
from matplotlib import style as mpl_style
from matplotlib.figure import Figure

from detr_peg.lab.study.comparisons import row_title, verdict_text
from detr_peg.lab.study.results import KIND_TITLES, KINDS, is_number, learning_curve, log_records

PLOTS_DIR = "plots"
#: Every figure in both formats: vector for print, PNG for screens and the docs.
FORMATS = ("pdf", "png")
DPI = 300
BARS = ("AP", "AP50", "AP75")
#: matplotlib's colour-blind-safe cycle; markers and line styles tell series apart in grey too.
COLOURS = mpl_style.library["tableau-colorblind10"]["axes.prop_cycle"].by_key()["color"]
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
HATCHES = ("", "//", "..", "xx", "\\\\", "++")
#: How far apart (in test-scale units) the series' points at one scale are drawn, so their error bars do not overlap.
DODGE = 0.025
#: Figure names a study writes, without the suffix (each in every format of :data:`FORMATS`).
STUDY_FIGURES = ("comparisons", "ap_vs_scale", "learning_curves", "main_metrics")
RUN_FIGURES = ("learning_curve",)


def figure_files(names: Sequence[str]) -> tuple[str, ...]:
    """The file names of figures ``names`` in every format."""
    return tuple(f"{name}.{fmt}" for name in names for fmt in FORMATS)


def interval(agg: dict[str, Any]) -> tuple[float, float]:
    """Mean and the half-width of its 95% interval over seeds (percent; nan and 0 without values)."""
    mean = agg["mean"] if agg["mean"] is not None else float("nan")
    n, std = agg.get("n", 0), agg.get("std")
    if std is None or n < 2:
        return mean, 0.0
    return mean, float(scipy_stats.t.ppf(0.975, n - 1)) * std / math.sqrt(n)


def series_label(entry: dict[str, Any]) -> str:
    """A setting's short label: its axis values (``peg``; ``peg, 0.5`` for two axes), else its name."""
    values = [str(v) for v in entry.get("values", {}).values()]
    return ", ".join(values) if values else entry["setting"]


def axis_name(key: str) -> str:
    """A grid axis's legend name: ``model.position.name`` -> ``position``, ``train.ema_decay`` -> ``ema_decay``."""
    parts = key.split(".")
    if len(parts) > 1:
        parts = parts[1:]
    if len(parts) > 1 and parts[-1] == "name":
        parts = parts[:-1]
    return ".".join(parts)


def legend_title(settings: Sequence[dict[str, Any]]) -> str | None:
    """What the series labels are values of: the axes' short names (None when no setting has axis values)."""
    keys = dict.fromkeys(key for e in settings for key in e.get("values", {}))
    return ", ".join(axis_name(key) for key in keys) or None


def short_setting(baseline: str | None) -> str:
    """The reference setting for a title: ``position=sine``, or a config by its stem."""
    if not baseline or "=" not in baseline:
        return baseline or "the reference"
    key, value = baseline.split("=", 1)
    return model_name(value) if key == "config" else f"{axis_name(key)}={value}"


def model_name(config: str) -> str:
    """A base config's name for titles: its file stem (``deformable_small``)."""
    return Path(config).stem


def by_model(settings: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Settings grouped by their base config, in study order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in settings:
        groups.setdefault(model_name(entry["config"]), []).append(entry)
    return groups


def _styles(settings: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One colour, marker, line style and hatch per series label, the same in every panel."""
    labels = list(dict.fromkeys(series_label(e) for e in settings))
    return {
        label: {"color": c, "marker": m, "linestyle": ls, "hatch": h}
        for label, c, m, ls, h in zip(
            labels, itertools.cycle(COLOURS), itertools.cycle(MARKERS), itertools.cycle(LINES), itertools.cycle(HATCHES)
        )
    }


def _legend(fig, axes, title: str | None = None, fontsize: float | None = None) -> None:
    """One legend for the figure, below the panels (never over the data), titled by what its labels are."""
    handles, labels = {}, []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = handle
                labels.append(label)
    if labels:
        fig.legend(
            [handles[label] for label in labels],
            labels,
            loc="lower center",
            ncol=min(len(labels), 6),
            frameon=False,
            bbox_to_anchor=(0.5, 0.0),
            title=title,
            fontsize=fontsize,
        )


def figure_ap_vs_scale(settings: list[dict[str, Any]]) -> Figure | None:
    """AP against test scale: a row of panels per model, a panel per kind of scale (None without scales)."""
    kinds = [k for k in KINDS if any(e[k] for e in settings)]
    if not kinds:
        return None
    models = by_model(settings)
    styles = _styles(settings)
    fig, axes = plt.subplots(
        len(models), len(kinds), figsize=(4.6 * len(kinds), 3.4 * len(models) + 0.6), squeeze=False, sharey="row"
    )
    for row, (model, entries) in zip(axes, models.items()):
        for ax, kind in zip(row, kinds):
            measured: set[float] = set()
            for e in entries:
                rows = e[kind]
                if not rows:
                    continue
                if not any(r["scale"] == 1.0 for r in rows):  # x1 of either kind is the configured size
                    rows = [{"scale": 1.0, **e["main"]}, *rows]
                xs = [r["scale"] for r in rows]
                measured.update(xs)
                ys, errs = zip(*(interval(r["AP"]) for r in rows))
                style = styles[series_label(e)]
                shift = DODGE * (entries.index(e) - (len(entries) - 1) / 2)  # bars side by side, not on top
                ax.errorbar(
                    [x + shift for x in xs], ys, yerr=errs, capsize=3, label=series_label(e), color=style["color"],
                    marker=style["marker"], linestyle=style["linestyle"],
                )  # fmt: skip
            ax.set_xticks(sorted(measured), [f"{s:g}" for s in sorted(measured)])
            ax.set_title(f"{model}: AP vs test scale, {KIND_TITLES[kind].split(' (')[0]}", fontsize=10)
            ax.set_xlabel("test scale (x validation size)")
            ax.grid(alpha=0.3)
        row[0].set_ylabel("AP (%)")
    _legend(fig, axes.flat, legend_title(settings))
    return _layout(fig, bottom=0.6)


def figure_learning_curves(settings: list[dict[str, Any]]) -> Figure | None:
    """AP against iteration, a panel per model; None when no setting evaluated at two iterations or more."""
    models = {m: es for m, es in by_model(settings).items() if any(len(e["curve"]) > 1 for e in es)}
    if not models:
        return None
    styles = _styles(settings)
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 3.8), squeeze=False)
    for ax, (model, entries) in zip(axes[0], models.items()):
        for e in entries:
            if len(e["curve"]) < 2:
                continue
            xs = [p["iteration"] for p in e["curve"]]
            ys, errs = zip(*(interval(p) for p in e["curve"]))
            style = styles[series_label(e)]
            ax.errorbar(
                xs, ys, yerr=errs, capsize=2, label=series_label(e), color=style["color"], marker=style["marker"],
                linestyle=style["linestyle"], markersize=4,
            )  # fmt: skip
        ax.set_xlabel("iteration")
        ax.set_ylabel("AP (%)")
        ax.set_title(f"{model}: validation AP during training", fontsize=10)
        ax.grid(alpha=0.3)
    _legend(fig, axes.flat, legend_title(settings))
    return _layout(fig, bottom=0.6)


def figure_main_metrics(settings: list[dict[str, Any]]) -> Figure | None:
    """Bars of AP, AP50 and AP75 per setting, a panel per model (None without settings)."""
    if not settings:
        return None
    models = by_model(settings)
    styles = _styles(settings)
    most = max(len(es) for es in models.values())
    fig, axes = plt.subplots(1, len(models), figsize=(max(4.5, 0.5 * most * len(BARS) + 1.5) * len(models), 3.8))
    axes = [axes] if len(models) == 1 else list(axes)
    for ax, (model, entries) in zip(axes, models.items()):
        width = 0.8 / len(entries)
        for i, e in enumerate(entries):
            ys, errs = zip(*(interval(e["main"][stat]) for stat in BARS))
            xs = [j + (i - (len(entries) - 1) / 2) * width for j in range(len(BARS))]
            style = styles[series_label(e)]
            ax.bar(
                xs, ys, width, yerr=errs, capsize=3, label=series_label(e), color=style["color"],
                hatch=style["hatch"], edgecolor="black", linewidth=0.5,
            )  # fmt: skip
        ax.set_xticks(range(len(BARS)), BARS)
        ax.set_ylabel("%")
        ax.set_title(f"{model}: AP, AP50, AP75 at the validation size", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    _legend(fig, axes, legend_title(settings))
    return _layout(fig, bottom=0.6)


def _seed_count(rows: Sequence[dict[str, Any]]) -> str:
    """How many paired seeds the rows have: ``5`` or ``4 to 5``."""
    counts = sorted({len(r["seeds"]) for r in rows})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"


def figure_comparisons(comparisons: dict[str, Any], settings: list[dict[str, Any]]) -> Figure | None:
    """The forest plot of paired differences (mean, 95% interval, verdict per row); None without rows."""
    rows = [r for r in comparisons.get("rows", []) if r.get("mean") is not None]
    if not rows:
        return None
    label_of = {e["setting"]: (model_name(e["config"]), series_label(e)) for e in settings}
    panels: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        panels.setdefault(label_of.get(r["setting"], ("", ""))[0], []).append(r)
    fig, axes = plt.subplots(
        len(panels),
        1,
        sharex=True,
        squeeze=False,
        figsize=(7.5, 0.32 * len(rows) + 0.7 * len(panels) + 1.0),
        gridspec_kw={"height_ratios": [len(group) + 1.5 for group in panels.values()]},
    )
    band = comparisons.get("equal_within")
    verdicts = list(dict.fromkeys(r["verdict"] for r in rows))
    marks = dict(zip(verdicts, itertools.cycle(zip(COLOURS, MARKERS))))
    reference = short_setting(comparisons.get("baseline"))
    rows_y = {model: list(range(len(group)))[::-1] for model, group in panels.items()}  # top row first
    for ax, (model, group) in zip(axes[:, 0], panels.items()):
        ys = rows_y[model]
        if band:
            ax.axvspan(-band, band, color="0.9", zorder=0, label=f"equal within ±{band:g} AP")
        ax.axvline(0.0, color="0.3", linewidth=0.8)
        for y, r in zip(ys, group):
            seeds = [d for d in r.get("differences") or [] if is_number(d)]
            ax.plot(seeds, [y] * len(seeds), "o", markerfacecolor="none", markeredgecolor="0.55",
                    markersize=3.5, markeredgewidth=0.7, linestyle="none", label="one seed", zorder=1)  # fmt: skip
            xerr = None if r.get("ci") is None else [[r["mean"] - r["ci"][0]], [r["ci"][1] - r["mean"]]]
            colour, marker = marks[r["verdict"]]
            ax.errorbar(r["mean"], y, xerr=xerr, fmt=marker, color=colour, capsize=3, zorder=2)
        names = []
        for r in group:
            label = label_of.get(r["setting"], ("", r["setting"]))[1]
            ref = label_of.get(r["reference"], ("", r["reference"]))[1]
            names.append(f"{label} - {ref}, {row_title(r)}")
        ax.set_yticks(ys, names, fontsize=7)
        ax.set_ylim(-0.75, len(group) - 0.25)
        ax.set_title(f"{model + ': ' if model else ''}AP, each setting minus {reference}", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    for ax, (model, group) in zip(axes[:, 0], panels.items()):  # after every panel's data: the x range is final
        right = ax.get_xlim()[1]
        for y, r in zip(rows_y[model], group):
            ax.text(right, y, f"  {verdict_text(r, band or 0.0)}", va="center", fontsize=7, clip_on=False)
    first = axes[0, 0]
    for verdict, (colour, marker) in marks.items():
        first.plot([], [], marker, color=colour, label=verdict_text({"verdict": verdict}, band or 0.0))
    axes[-1, 0].set_xlabel(f"difference in AP points (mean and 95% interval over {_seed_count(rows)} paired seeds)")
    _legend(fig, [first], fontsize=7)
    return _layout(fig, bottom=0.35)


def plot_study(study_dir: str | Path, results: dict[str, Any]) -> list[Path]:
    """Draw every figure of a study's results (removing stale ones with nothing to draw); the files written."""
    out = Path(study_dir) / PLOTS_DIR
    make_folder(out)
    settings = results["settings"]
    figures = {
        "comparisons": figure_comparisons(results.get("comparisons") or {}, settings),
        "ap_vs_scale": figure_ap_vs_scale(settings),
        "learning_curves": figure_learning_curves(settings),
        "main_metrics": figure_main_metrics(settings),
    }
    for stale in figure_files([name for name, fig in figures.items() if fig is None]):
        with writing(out / stale, "remove"):
            (out / stale).unlink(missing_ok=True)
    return [path for name, fig in figures.items() if fig is not None for path in save(fig, out, name)]


def plot_run(run_dir: str | Path) -> list[Path]:
    """Draw a training run's learning curve from its ``metrics.jsonl`` into ``RUN/plots/learning_curve.*``."""
    run_dir = Path(run_dir)
    log = run_dir / "metrics.jsonl"
    try:
        records = list(log_records(log, missing_ok=False))  # an unreadable log is the OS's one-line error
    except UnicodeDecodeError:
        raise DataError(
            f"{log} is not UTF-8 text, as the metrics.jsonl of detr-peg train is; nothing to plot."
        ) from None
    losses = [
        (record["iteration"], record["loss"])
        for record in records
        if record.get("type") == "iter" and is_number(record.get("loss")) and is_number(record.get("iteration"))
    ]
    curves = {stat: learning_curve(records, stat) for stat in ("AP", "AP50")}
    if not losses and not any(curves.values()):
        raise DataError(
            f"{log} holds no usable record (no training iteration with a loss and no evaluation); nothing to plot. "
            "Plot a run after its first logged iteration."
        )
    fig, (ax_ap, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8))
    for (stat, curve), colour, marker, line in zip(curves.items(), COLOURS, MARKERS, LINES):
        if curve:  # percent (learning_curve reads older logs too)
            ax_ap.plot(*zip(*curve), marker=marker, color=colour, linestyle=line, label=stat)
    ax_ap.set_xlabel("iteration")
    ax_ap.set_ylabel("%")
    ax_ap.set_title(f"{run_dir.name}: validation AP", fontsize=10)
    ax_ap.grid(alpha=0.3)
    if ax_ap.lines:
        ax_ap.legend()
    if losses:
        ax_loss.plot(*zip(*losses), color=COLOURS[0])
    ax_loss.set_xlabel("iteration")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(f"{run_dir.name}: training loss", fontsize=10)
    ax_loss.grid(alpha=0.3)
    out = run_dir / PLOTS_DIR
    make_folder(out)
    return save(_layout(fig), out, "learning_curve")


def _layout(fig: Figure, bottom: float = 0.0) -> Figure:
    """Tight layout, keeping ``bottom`` inches free for the figure's legend."""
    fig.tight_layout(rect=(0, bottom / fig.get_figheight(), 1, 1))
    return fig


def save(fig: Figure, out: Path, name: str) -> list[Path]:
    """Write ``out/name`` in every format of :data:`FORMATS` and close the figure."""
    try:
        return [save_figure(out / f"{name}.{fmt}", fig, dpi=DPI, bbox_inches="tight") for fmt in FORMATS]
    finally:
        plt.close(fig)
