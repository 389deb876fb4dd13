"""The figures of a study and of a single run, drawn with matplotlib (Agg, no display needed).

A study's figures go into ``STUDY/plots/``:

* ``ap_vs_scale.png``: AP against the test scale, one line per setting (mean
  and standard deviation over seeds as error bars), one panel per kind of
  test scale (resized / larger canvas), never mixed in one panel;
* ``learning_curves.png``: AP against the training iteration from the
  periodic evaluations, mean line and a +- one standard deviation band;
* ``main_metrics.png``: bars of AP, AP50 and AP75 at the configured
  validation size per setting, with standard-deviation error bars.

A single run's figure is ``RUN/plots/learning_curve.png``: AP (and AP50)
against iteration, and the training loss.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from detr_peg.errors import ConfigError, DataError
from detr_peg.fileio.atomic import save_figure
from detr_peg.fileio.os_errors import make_folder

try:
    import matplotlib
except ImportError:
    raise ConfigError("Plots need matplotlib: pip install 'detr_peg[study]' (or pip install matplotlib).") from None

matplotlib.use("Agg")  # files only: no display, safe in jobs and tests
import matplotlib.pyplot as plt  # after choosing the backend

from detr_peg.study.results import KIND_TITLES, KINDS, is_number, learning_curve

PLOTS_DIR = "plots"
BARS = ("AP", "AP50", "AP75")


def _pct(agg: dict[str, Any]) -> tuple[float, float]:
    """Mean and std (percent, as the study's results hold them; nan and 0 without values)."""
    mean = agg["mean"] if agg["mean"] is not None else float("nan")
    return mean, agg["std"] or 0.0


def plot_ap_vs_scale(settings: list[dict[str, Any]], out: Path) -> Path | None:
    kinds = [k for k in KINDS if any(e[k] for e in settings)]
    if not kinds:
        return None
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.2), squeeze=False, sharey=True)
    for ax, kind in zip(axes[0], kinds):
        for e in settings:
            rows = e[kind]
            if not rows:
                continue
            if not any(r["scale"] == 1.0 for r in rows):  # x1 of either kind is the evaluation at the configured size
                rows = [{"scale": 1.0, **e["main"]}, *rows]
            xs = [r["scale"] for r in rows]
            ys, errs = zip(*(_pct(r["AP"]) for r in rows))
            ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=e["setting"])
        ax.set_title(KIND_TITLES[kind].split(" (")[0], fontsize=11)
        ax.set_xlabel("test scale (x training / validation size)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("AP (%)")
    axes[0][-1].legend(fontsize=7, loc="best")
    return _save(fig, out / "ap_vs_scale.png")


def plot_learning_curves(settings: list[dict[str, Any]], out: Path) -> Path | None:
    if not any(e["curve"] for e in settings):
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for e in settings:
        if not e["curve"]:
            continue
        xs = [p["iteration"] for p in e["curve"]]
        means, stds = zip(*(_pct(p) for p in e["curve"]))
        (line,) = ax.plot(xs, means, marker=".", label=e["setting"])
        ax.fill_between(
            xs,
            [m - s for m, s in zip(means, stds)],
            [m + s for m, s in zip(means, stds)],
            color=line.get_color(),
            alpha=0.2,
        )
    ax.set_xlabel("iteration")
    ax.set_ylabel("AP (%)")
    ax.set_title("Learning curves (mean ± std over seeds)", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out / "learning_curves.png")


def plot_main_bars(settings: list[dict[str, Any]], out: Path) -> Path | None:
    if not settings:
        return None
    width = 0.8 / len(BARS)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(settings) + 2), 4.2))
    for i, stat in enumerate(BARS):
        ys, errs = zip(*(_pct(e["main"][stat]) for e in settings))
        xs = [j + (i - (len(BARS) - 1) / 2) * width for j in range(len(settings))]
        ax.bar(xs, ys, width, yerr=errs, capsize=3, label=stat)
    ax.set_xticks(range(len(settings)), [e["setting"] for e in settings], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("%")
    ax.set_title("At the configured validation size (mean ± std over seeds)", fontsize=11)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, out / "main_metrics.png")


def plot_study(study_dir: str | Path, results: dict[str, Any]) -> list[Path]:
    """Draw every figure of a study from its results (:func:`detr_peg.study.results.collect`)."""
    out = Path(study_dir) / PLOTS_DIR
    make_folder(out)
    settings = results["settings"]
    drawn = [plot_ap_vs_scale(settings, out), plot_learning_curves(settings, out), plot_main_bars(settings, out)]
    return [p for p in drawn if p is not None]


def plot_run(run_dir: str | Path) -> Path:
    """Draw a training run's learning curve from its ``metrics.jsonl`` into ``RUN/plots/learning_curve.png``."""
    run_dir = Path(run_dir)
    log = run_dir / "metrics.jsonl"
    losses = []
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(record, dict)
            and record.get("type") == "iter"
            and is_number(record.get("loss"))
            and is_number(record.get("iteration"))
        ):
            losses.append((record["iteration"], record["loss"]))
    curves = {stat: learning_curve(log, stat) for stat in ("AP", "AP50")}
    if not losses and not any(curves.values()):
        raise DataError(
            f"{log} holds no usable record (no training iteration with a loss and no evaluation); nothing to plot. "
            "Plot a run after its first logged iteration."
        )
    fig, (ax_ap, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
    for stat, curve in curves.items():
        if curve:
            ax_ap.plot(*zip(*curve), marker="o", label=stat)  # percent (learning_curve reads older logs too)
    ax_ap.set_xlabel("iteration")
    ax_ap.set_ylabel("%")
    ax_ap.set_title("Evaluation", fontsize=11)
    ax_ap.grid(alpha=0.3)
    if ax_ap.lines:
        ax_ap.legend()
    if losses:
        ax_loss.plot(*zip(*losses))
    ax_loss.set_xlabel("iteration")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title("Training loss", fontsize=11)
    ax_loss.grid(alpha=0.3)
    out = run_dir / PLOTS_DIR
    make_folder(out)
    return _save(fig, out / "learning_curve.png")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    try:
        save_figure(path, fig, dpi=100)
    finally:
        plt.close(fig)
    return path
