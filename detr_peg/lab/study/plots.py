"""The figures of a study (``STUDY/plots/``) and of a run (``RUN/plots/``), as PDF and 300 dpi PNG.

Error bars are 95% t intervals of the mean over seeds (none below two seeds).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy import stats as scipy_stats

from detr_peg.config.ranges import is_number
from detr_peg.errors import ConfigError, DataError
from detr_peg.messages import install_hint, shortened
from detr_peg.outputs import make_folder, save_figure, writing

os.environ["MPLBACKEND"] = "agg"  # matplotlib refuses an unknown one on import; the files are drawn with Agg anyway
try:
    import matplotlib
except ImportError:
    raise ConfigError(f"Plots need matplotlib: {install_hint('matplotlib')}.") from None

matplotlib.use("Agg")  # files only: no display, safe in jobs and tests
import matplotlib.pyplot as plt  # after choosing the backend
from matplotlib import style as mpl_style
from matplotlib.figure import Figure

from detr_peg.engine.metrics_log import log_records
from detr_peg.lab.study.comparisons import row_title
from detr_peg.lab.study.results import KIND_TITLES, KINDS, learning_curve
from detr_peg.lab.study.stored_files import FORMATS, figure_files, read_confusion

matplotlib.rcParams["text.parse_math"] = False  # class and folder names are drawn as written, never as TeX

PLOTS_DIR = "plots"
DPI = 300
BARS = ("AP", "AP50", "AP75")
#: matplotlib's colour-blind-safe cycle; markers and line styles tell series apart in grey too.
COLOURS = mpl_style.library["tableau-colorblind10"]["axes.prop_cycle"].by_key()["color"]
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
#: One fixed colour and marker per encoding and per verdict, the same in every figure.
ENCODING_STYLES = {
    "sine": {"color": COLOURS[0], "marker": "o", "linestyle": "-"},
    "peg": {"color": COLOURS[1], "marker": "D", "linestyle": "--"},
    "learned": {"color": COLOURS[3], "marker": "s", "linestyle": "-."},
    "none": {"color": COLOURS[2], "marker": "^", "linestyle": ":"},
}
VERDICT_MARKS = {
    "behind": ("#b2182b", "v"),
    "ahead": ("#2166ac", "^"),
    "equal": ("#1b7837", "o"),
    "undecided": ("0.45", "s"),
}
#: Names a reader knows, for the values and config stems the figures show.
DISPLAY = {"peg": "PEG", "sine": "sine", "learned": "learned", "none": "none"}
#: A page is 7 inches wide; a column 3.4.
PAGE_WIDTH = 7.0


def interval(agg: dict[str, Any]) -> tuple[float, float]:
    """Mean and the half-width of its 95% interval over seeds (percent; nan and 0 without values)."""
    mean = agg["mean"] if agg["mean"] is not None else float("nan")
    n, std = agg.get("n", 0), agg.get("std")
    if std is None or n < 2:
        return mean, 0.0
    return mean, float(scipy_stats.t.ppf(0.975, n - 1)) * std / math.sqrt(n)


def series_label(entry: dict[str, Any]) -> str:
    """A setting's short label: its axis values (``PEG``; ``PEG, 0.5`` for two axes), else its name."""
    values = [DISPLAY.get(str(v), str(v)) for v in entry.get("values", {}).values()]
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
    """The reference setting for a title: ``sine`` (an encoding), ``ema_decay=0.0``, or a config's name."""
    if not baseline or "=" not in baseline:
        return baseline or "the reference"
    key, value = baseline.split("=", 1)
    if key == "config":
        return model_name(value)
    return DISPLAY.get(value, value) if axis_name(key) == "position" else f"{axis_name(key)}={value}"


def model_name(config: str) -> str:
    """A base config's name for titles: ``deformable_small_multiscale`` -> ``Deformable-DETR (small, multiscale)``."""
    words = Path(config).stem.split("_")
    family = "Deformable-DETR" if "deformable" in words else "DETR" if "detr" in words else None
    if family is None:
        return Path(config).stem
    rest = [w for w in words if w not in ("deformable", "detr")]
    return f"{family} ({', '.join(rest)})" if rest else family


def by_model(settings: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Settings grouped by their base config, in study order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in settings:
        groups.setdefault(model_name(entry["config"]), []).append(entry)
    return groups


def _styles(settings: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One colour, marker and line style per series label, the same in every panel (the encodings' in every
    figure)."""
    labels = list(dict.fromkeys(series_label(e) for e in settings))
    by_name = {DISPLAY.get(k, k): v for k, v in ENCODING_STYLES.items()}
    cycle = zip(itertools.cycle(COLOURS[4:]), itertools.cycle(MARKERS), itertools.cycle(LINES))
    return {
        label: by_name[label] if label in by_name else dict(zip(("color", "marker", "linestyle"), next(cycle)))
        for label in labels
    }


def _training_sides(config: str) -> tuple[float, float] | None:
    """The smallest and largest ``data.train_scales`` of a config file and its ``_base_`` files (read as YAML: a
    plot imports no model), or None when they cannot be read."""
    try:
        data = yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}
        scales = (data.get("data") or {}).get("train_scales")
        bases = data.get("_base_") or []
        for base in [bases] if isinstance(bases, str) else bases:
            scales = scales or (_training_sides(str(Path(config).parent / base)) or None)
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return None
    if isinstance(scales, tuple):
        return scales
    return (min(scales), max(scales)) if isinstance(scales, list) and scales else None


def _legend(fig, axes, title: str | None = None, fontsize: float | None = None) -> None:
    """One legend for the figure, below the panels (never over the data), titled by what its labels are."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(len(handles), 6), frameon=False,
                   bbox_to_anchor=(0.5, 0.0), title=title, fontsize=fontsize)  # fmt: skip


def figure_ap_vs_scale(settings: list[dict[str, Any]]) -> Figure | None:
    """AP against test size in pixels (the scale where sizes are unknown): a row of panels per model, a panel
    per kind of scale, the training range shaded (None without scales)."""
    kinds = [k for k in KINDS if any(e[k] for e in settings)]
    if not kinds:
        return None
    models = by_model(settings)
    styles = _styles(settings)
    fig, axes = plt.subplots(
        len(models), len(kinds), figsize=(PAGE_WIDTH, 2.6 * len(models) + 0.6), squeeze=False, sharey="row"
    )
    for row, (model, entries) in zip(axes, models.items()):
        for ax, kind in zip(row, kinds):
            measured: set[float] = set()
            pixels = all(r.get("size") for e in entries for r in e[kind])
            base = next((r["size"] / r["scale"] for e in entries for r in e[kind] if pixels), None)
            for e in entries:
                rows = e[kind]
                if not rows:
                    continue
                if not any(r["scale"] == 1.0 for r in rows):  # x1 of either kind is the configured size
                    rows = [{"scale": 1.0, "size": base, **e["main"]}, *rows]
                xs = [float(r["size"]) if pixels else r["scale"] for r in rows]
                measured.update(xs)
                ys, errs = zip(*(interval(r["AP"]) for r in rows))
                style = styles[series_label(e)]
                step = (max(xs) - min(xs)) / 60 if len(xs) > 1 else 0.0
                shift = step * (entries.index(e) - (len(entries) - 1) / 2)  # intervals side by side, not on top
                ax.errorbar(
                    [x + shift for x in xs], ys, yerr=errs, capsize=2, label=series_label(e), color=style["color"],
                    marker=style["marker"], linestyle="none", markersize=4,
                )  # fmt: skip
            sides = _training_sides(entries[0]["config"]) if pixels and kind == "resized" else None
            if sides is not None:
                low, high = sides
                ax.axvspan(low - 4, high + 4, color="0.92", zorder=0, label="training sizes")
            ax.set_xticks(sorted(measured), [f"{s:g}" for s in sorted(measured)])
            ax.set_title(f"{model}, {KIND_TITLES[kind].split(' (')[0]}", fontsize=8)
            ax.set_xlabel("test size (px, shorter side)" if pixels else "test scale (x validation size)", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        row[0].set_ylabel("AP (%)", fontsize=8)
    _legend(fig, axes.flat, legend_title(settings), fontsize=7)
    return _layout(fig, bottom=0.5)


def figure_learning_curves(settings: list[dict[str, Any]]) -> Figure | None:
    """AP against iteration, a panel per model; None when no setting evaluated at two iterations or more."""
    models = {m: es for m, es in by_model(settings).items() if any(len(e["curve"]) > 1 for e in es)}
    if not models:
        return None
    styles = _styles(settings)
    fig, axes = plt.subplots(1, len(models), figsize=(PAGE_WIDTH, 2.8), squeeze=False)
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
        ax.set_title(f"{model}: validation AP during training", fontsize=8)
        ax.grid(alpha=0.3)
    _legend(fig, axes.flat, legend_title(settings))
    return _layout(fig, bottom=0.6)


def figure_main_metrics(settings: list[dict[str, Any]]) -> Figure | None:
    """AP, AP50 and AP75 per setting at the validation size, mean and 95% interval, a panel per model and metric,
    each with its own axis (None without settings)."""
    if not settings:
        return None
    models = by_model(settings)
    styles = _styles(settings)
    fig, axes = plt.subplots(len(models), len(BARS), figsize=(PAGE_WIDTH, 1.9 * len(models) + 0.6), squeeze=False)
    for row, (model, entries) in zip(axes, models.items()):
        for ax, stat in zip(row, BARS):
            for i, e in enumerate(entries):
                y, err = interval(e["main"][stat])
                style = styles[series_label(e)]
                ax.errorbar(
                    [i], [y], yerr=[err], capsize=3, label=series_label(e), color=style["color"],
                    marker=style["marker"], linestyle="none",
                )  # fmt: skip
            ax.set_xticks(range(len(entries)), [series_label(e) for e in entries], fontsize=7)
            ax.set_xlim(-0.6, len(entries) - 0.4)
            ax.set_title(stat, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(axis="y", alpha=0.3)
        row[0].set_ylabel(f"{model}\n% (mean, 95% interval)", fontsize=7)
    return _layout(fig)


def _seed_count(rows: Sequence[dict[str, Any]]) -> str:
    """How many paired seeds the rows have: ``5`` or ``4 to 5``."""
    counts = sorted({len(r["seeds"]) for r in rows})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"


#: Comparison-row kinds drawn in one panel (each panel has its own x axis).
FAMILIES = {"val": "test size", "resized": "test size", "canvas": "larger canvas", "padding": "padded batches"}


def _row_name(r: dict[str, Any], label_of: dict[str, tuple[str, str]], sizes: dict[tuple, Any]) -> str:
    """``PEG - sine, AP at 64 px`` where the size is known, else the report's row title."""
    label = label_of.get(r["setting"], ("", r["setting"]))[1]
    ref = label_of.get(r["reference"], ("", r["reference"]))[1]
    kind, scale = r.get("kind"), r.get("scale")
    size = sizes.get((r["setting"], "resized" if kind == "val" else kind, 1.0 if kind == "val" else scale))
    what = f"AP at {size:g} px" if size and kind in ("val", "resized", "canvas") else row_title(r)
    return f"{label} - {ref}, {what}"


def figure_comparisons(comparisons: dict[str, Any], settings: list[dict[str, Any]]) -> Figure | None:
    """The paired differences (mean, 95% interval, verdict, the seeds) per row; a panel per model and family of
    rows, each with its own x axis; None without rows."""
    rows = [r for r in comparisons.get("rows", []) if r.get("mean") is not None]
    if not rows:
        return None
    label_of = {e["setting"]: (model_name(e["config"]), series_label(e)) for e in settings}
    sizes = {(e["setting"], kind, r["scale"]): r.get("size") for e in settings for kind in KINDS for r in e[kind]}
    panels: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        model = label_of.get(r["setting"], ("", ""))[0]
        panels.setdefault((model, FAMILIES.get(r.get("kind"), "other")), []).append(r)
    order = {setting: i for i, setting in enumerate(dict.fromkeys(r["setting"] for r in rows))}

    def size_of(r: dict[str, Any]) -> float:
        return r.get("scale") or (1.0 if r.get("kind") == "val" else 0.0)

    panels = {key: sorted(group, key=lambda r: (order[r["setting"]], size_of(r))) for key, group in panels.items()}
    models = list(dict.fromkeys(model for model, _ in panels))
    families = list(dict.fromkeys(family for _, family in panels))
    tallest = {f: max(len(g) for (_, family), g in panels.items() if family == f) for f in families}
    fig, axes = plt.subplots(
        len(families), len(models), squeeze=False,
        figsize=(PAGE_WIDTH if len(models) == 1 else 2 * PAGE_WIDTH - 3, 0.2 * sum(tallest.values()) + 0.7 * len(families) + 0.8),
        gridspec_kw={"height_ratios": [tallest[f] + 1.8 for f in families]},
    )  # fmt: skip
    band = comparisons.get("equal_within")
    reference = short_setting(comparisons.get("baseline"))
    for (i, family), (j, model) in itertools.product(enumerate(families), enumerate(models)):
        ax, group = axes[i, j], panels.get((model, family), [])
        if not group:
            ax.axis("off")
            continue
        ys = list(range(len(group)))[::-1]  # top row first
        if band:
            ax.axvspan(-band, band, color="0.92", zorder=0, label=f"margin ±{band:g} AP")
        ax.axvline(0.0, color="0.3", linewidth=0.8)
        for y, r in zip(ys, group):
            seeds = [d for d in r.get("differences") or [] if is_number(d)]
            ax.plot(seeds, [y] * len(seeds), "o", markerfacecolor="none", markeredgecolor="0.6",
                    markersize=3, markeredgewidth=0.6, linestyle="none", label="one seed", zorder=1)  # fmt: skip
            xerr = None if r.get("ci") is None else [[r["mean"] - r["ci"][0]], [r["ci"][1] - r["mean"]]]
            colour, marker = VERDICT_MARKS[r["verdict"]]
            decided = r["verdict"] in ("ahead", "behind")
            ax.errorbar(r["mean"], y, xerr=xerr, fmt=marker, color=colour, capsize=3, zorder=2,
                        markersize=7 if decided else 5, elinewidth=2.0 if decided else 1.0)  # fmt: skip
        ax.set_yticks(ys, [_row_name(r, label_of, sizes) for r in group], fontsize=7)
        for tick, r in zip(ax.get_yticklabels(), group):
            if r["verdict"] in ("ahead", "behind"):
                tick.set_fontweight("bold")
        ax.set_ylim(-0.75, tallest[family] - 0.25)
        ax.set_title(f"{model + ': ' if model else ''}{family}, AP minus {reference}", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
        right = ax.get_xlim()[1]
        for y, r in zip(ys, group):
            ax.text(right, y, f" {r['verdict']}", va="center", fontsize=7, clip_on=False, color=VERDICT_MARKS[r["verdict"]][0],
                    fontweight="bold" if r["verdict"] in ("ahead", "behind") else "normal")  # fmt: skip
        if i == len(families) - 1 or not panels.get((model, families[i + 1])):
            ax.set_xlabel(
                f"paired difference in AP points (mean, 95% interval, {_seed_count(group)} seeds)", fontsize=7
            )
    first = axes[0, 0]
    for name, (colour, marker) in VERDICT_MARKS.items():
        first.plot([], [], marker, color=colour, label=name)
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


def figure_confusion(matrix: dict[str, Any], title: str) -> Figure:
    """A ``confusion_matrix.json`` drawn row-normalised (classes with no ground truth and no detection left out)."""
    counts = np.asarray(matrix["counts"], dtype=float)
    keep = np.flatnonzero(counts.sum(0) + counts.sum(1))
    counts, names = counts[np.ix_(keep, keep)], [shortened(matrix["names"][i], 40) for i in keep]  # bounded canvas
    shares = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    side = min(3 + 0.22 * len(names) + 0.06 * max(map(len, names), default=0), 24)  # room for the labels: tight layout
    fig, ax = plt.subplots(figsize=(side, side * 0.9))
    fig.colorbar(ax.imshow(shares, cmap="Blues", vmin=0, vmax=1), ax=ax, shrink=0.8, label="share of the row")
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    for (i, j), n in np.ndenumerate(counts if len(names) <= 16 else []):
        if n:
            ax.text(j, i, f"{n:.0f}", ha="center", va="center", fontsize=7, color="w" if shares[i, j] > 0.5 else "k")
    ax.set(xlabel="detected class", ylabel="ground truth class")
    ax.set_title(f"{title}: IoU >= {matrix['iou']:g}, score >= {matrix['score_threshold']:g}", fontsize=10)
    return fig


def plot_run(run_dir: str | Path) -> list[Path]:
    """Draw a run's learning curve (``metrics.jsonl``) and confusion matrix (if written) into ``RUN/plots/``."""
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
    matrix = read_confusion(run_dir / "confusion_matrix.json")  # evaluation.per_class.CONFUSION_JSON needs torch
    fig, (ax_ap, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8))
    for (stat, curve), colour, marker, line in zip(curves.items(), COLOURS, MARKERS, LINES):
        if curve:  # percent (learning_curve reads older logs too)
            ax_ap.plot(*zip(*curve), marker=marker, color=colour, linestyle=line, label=stat)
    if ax_ap.lines:
        ax_ap.legend()
    if losses:
        ax_loss.plot(*zip(*losses), color=COLOURS[0])
    for ax, unit, what in ((ax_ap, "%", "validation AP"), (ax_loss, "loss", "training loss")):
        ax.set(xlabel="iteration", ylabel=unit)
        ax.set_title(f"{run_dir.name}: {what}", fontsize=10)
        ax.grid(alpha=0.3)
    out = run_dir / PLOTS_DIR
    make_folder(out)
    files = save(_layout(fig), out, "learning_curve")
    return files + (save(_layout(figure_confusion(matrix, run_dir.name)), out, "confusion_matrix") if matrix else [])


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
