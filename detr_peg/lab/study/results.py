"""A study's results: read back from its cells (or ``cells.csv`` rows), averaged over seeds, written as tables.

COCO numbers in percent; -1 ("no such objects") is left out of the averages.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from detr_peg.config.ranges import is_number
from detr_peg.engine.evaluation.metric_units import UNIT, percent_metrics, read_metrics
from detr_peg.engine.metrics_log import log_records
from detr_peg.errors import UserError
from detr_peg.lab.study.cell import cell_paths, read_state, reported_status, table_row
from detr_peg.lab.study.comparisons import (
    ALPHA,
    PADDING_CHANGE,
    PERMUTATION_BELOW,
    POWER,
    ComparisonOptions,
    cell_rows,
    compare,
    format_points,
    row_title,
    sign_flip_pairs_to_decide,
    verdict_text,
)
from detr_peg.lab.study.grid import Cell, StudyDefinition
from detr_peg.lab.study.seed_rule import SeedRule, describe_stop
from detr_peg.lab.study.stored_files import (
    CELLS_CSV,
    EVAL_METRICS,
    PADDING,
    SCALES,
    read_eval_file,
    read_report_cells,
    write_cells_csv,
)
from detr_peg.outputs import atomic_write_text, write_json

STATS = ("AP", "AP50", "AP75", "APs", "APm", "APl")
KINDS = {"resized": "scales_resized.json", "canvas": "scales_canvas.json"}
KIND_TITLES = {
    "resized": "resized (same images, object scale changes with the size)",
    "canvas": "larger canvas (objects keep the training sizes, only the sequence length changes)",
}
RESULTS_JSON, RESULTS_CSV, RESULTS_MD = "study.json", "study.csv", "study.md"
#: What :func:`training_cost` measures per cell, in the order of the report's cost table.
COST_KEYS = ("iterations", "iter_seconds", "wall_minutes")


def learning_curve(records: Iterable[dict[str, Any]], stat: str = "AP") -> list[tuple[int, float]]:
    """``(iteration, value in percent)`` of ``stat`` in every ``eval`` record (last one per iteration)."""
    points: dict[int, float] = {}
    for record in records:
        if record.get("type") == "eval" and is_number(record.get("iteration")):
            value = None
            with contextlib.suppress(ValueError):  # a record of no known unit is not one
                value = read_metrics(record).get(stat)  # percent, from older logs in fractions too
            if is_number(value) and value >= 0:  # COCO's -1: undefined (no ground truth of that size)
                points[int(record["iteration"])] = value
    return sorted(points.items())


def training_cost(records: Iterable[dict[str, Any]]) -> dict[str, float] | None:
    """``{"iterations", "iter_seconds" (median), "wall_minutes" (summed over resumed segments)}``, or None."""
    times: list[float] = []
    wall = 0.0
    segment: list[float] = []
    iterations = 0
    for record in records:
        if record.get("type") == "start" and segment:
            wall += segment[-1] - segment[0]
            segment = []
        if is_number(record.get("time")):
            segment.append(float(record["time"]))
        if record.get("type") == "iter" and is_number(record.get("iter_time")):
            times.append(float(record["iter_time"]))
            if is_number(record.get("iteration")):
                iterations = max(iterations, int(record["iteration"]))
        if record.get("type") == "end" and is_number(record.get("iterations")):
            iterations = max(iterations, int(record["iterations"]))  # iterations after the last one logged
    if not times:
        return None
    if segment:
        wall += segment[-1] - segment[0]
    return {"iterations": iterations, "iter_seconds": statistics.median(times), "wall_minutes": wall / 60}


def collect_cell(study_dir: Path, cell: Cell) -> dict[str, Any]:
    """Everything measured for one cell (missing parts are None or empty)."""
    paths = cell_paths(study_dir, cell)
    state = read_state(paths) or {}
    log = list(log_records(paths.run / "metrics.jsonl"))
    main = read_eval_file(paths.eval / "metrics.json", EVAL_METRICS) or read_eval_file(
        paths.run / "metrics.json", EVAL_METRICS
    )
    record: dict[str, Any] = {
        "name": cell.name,
        "setting": cell.setting,
        "seed": cell.seed,
        "config": cell.config,
        "values": dict(cell.values),
        "status": reported_status(state, paths, study_dir),
        "error": state.get("error"),
        "config_resolved": state.get("config_resolved"),
        "published": False,
        "metrics": read_metrics(main) if main and state.get("status") == "done" else None,
        "curve": learning_curve(log),
        "cost": training_cost(log),
    }
    for kind, name in KINDS.items():
        data = read_eval_file(paths.eval / name, SCALES)
        unit = data.get("unit") if data else None
        rows = sorted(data["results"], key=lambda row: float(row["scale"])) if data else []
        record[kind] = [{**row, "metrics": percent_metrics(row["metrics"], unit)} for row in rows]
    padding = read_eval_file(paths.eval / "padding.json", PADDING)
    if padding:
        modes = padding.get("modes", {})
        padding["modes"] = {
            m: {**r, "metrics": percent_metrics(r["metrics"], padding.get("unit"))} for m, r in modes.items()
        }
    record["padding"] = padding
    return record


def cell_records(study_dir: Path, cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """Every cell's record: from its folder, or its published row of ``cells.csv`` (paired by config and values)."""
    records = []
    for cell in cells:
        row = table_row(study_dir, cell)
        identity = {"setting": cell.setting, "seed": cell.seed, "config": cell.config, "values": dict(cell.values)}
        records.append({**row, **identity} if row else collect_cell(study_dir, cell))
    return records


def aggregate(values: Sequence[float], signed: bool = False) -> dict[str, Any]:
    """``{"mean", "std", "n", "values"}`` (std None below two); negatives (COCO's -1) left out unless ``signed``."""
    kept = [float(v) for v in values if v is not None and (signed or v >= 0)]
    n = len(kept)
    mean = sum(kept) / n if n else None
    std = math.sqrt(sum((v - mean) ** 2 for v in kept) / (n - 1)) if n > 1 else None
    return {"mean": mean, "std": std, "n": n, "values": kept}


def padding_change(cell: dict[str, Any]) -> float | None:
    """A cell's AP in padded batches minus its AP one image at a time (None without both, or when equal)."""
    return cell_rows(cell).get(("padding", PADDING_CHANGE))


def summarize(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per setting, in cell order: main metrics, both kinds of scales, padding, learning curve."""
    settings: dict[str, list[dict[str, Any]]] = {}
    for cell in cells:
        settings.setdefault(cell["setting"], []).append(cell)
    out = []
    for setting, members in settings.items():
        done = [c for c in members if c["metrics"] is not None]
        entry: dict[str, Any] = {
            "setting": setting,
            "config": members[0]["config"],
            "values": members[0]["values"],
            "seeds": [c["seed"] for c in done],
            "cells": len(members),
            "main": {s: aggregate([c["metrics"].get(s) for c in done]) for s in STATS},
        }
        for kind in KINDS:
            by_scale: dict[float, list[dict[str, Any]]] = {}
            for c in done:
                for row in c[kind]:
                    by_scale.setdefault(float(row["scale"]), []).append(row)
            entry[kind] = [
                {
                    "scale": scale,
                    "size": rows[0].get("size"),
                    **{s: aggregate([r["metrics"].get(s) for r in rows]) for s in STATS},
                }
                for scale, rows in sorted(by_scale.items())
            ]
        modes: dict[str, list[float]] = {}
        diffs: dict[str, float] = {}
        for c in done:
            if c["padding"]:
                for mode, result in c["padding"].get("modes", {}).items():
                    modes.setdefault(mode, []).append(result["metrics"].get("AP"))
                for key, value in c["padding"].items():
                    if key.startswith("max_abs_logit_diff_") and isinstance(value, (int, float)):
                        diffs[key] = max(diffs.get(key, 0.0), float(value))
        entry["padding"] = {"AP": {mode: aggregate(v) for mode, v in modes.items()}, **diffs}
        changes = [padding_change(c) for c in done]  # what padded batches did to each cell's AP
        if any(change is not None for change in changes):
            entry["padding"]["AP"][PADDING_CHANGE] = aggregate(changes, signed=True)
        entry["curve"] = mean_curve([c["curve"] for c in done])
        costs = [c["cost"] for c in done if c.get("cost")]
        entry["cost"] = {key: aggregate([c[key] for c in costs]) for key in COST_KEYS}
        out.append(entry)
    return out


def mean_curve(curves: Sequence[Sequence[tuple[int, float]]]) -> list[dict[str, Any]]:
    """Mean and std of AP at the iterations every seed evaluated at."""
    if not curves:
        return []
    common = set.intersection(*(set(dict(c)) for c in curves))
    return [{"iteration": it, **aggregate([dict(c)[it] for c in curves])} for it in sorted(common)]


def collect(
    study_dir: str | Path,
    definition: StudyDefinition,
    cells: Sequence[Cell],
    options: ComparisonOptions | None = None,
    rule: SeedRule | None = None,
) -> dict[str, Any]:
    """The study's results: ``{"definition", "cells", "settings", "comparisons"}``, with a rule ``"seeds_auto"``."""
    study_dir = Path(study_dir)
    records = cell_records(study_dir, cells)
    results = {"definition": definition.to_dict(), "unit": UNIT, "cells": records, "settings": summarize(records)}
    results["comparisons"] = compare(results, options or ComparisonOptions())
    if rule is not None:
        results["seeds_auto"] = {
            **rule.to_dict(),
            "stopped": describe_stop(results["comparisons"], definition.seeds, rule, _pending(records)),
        }
    return results


def write_results(study_dir: str | Path, results: dict[str, Any]) -> list[Path]:
    """Write ``study.json``, ``study.csv``, ``cells.csv`` and ``study.md``; returns their paths."""
    study_dir = Path(study_dir)
    files = [write_json(study_dir / RESULTS_JSON, results), write_cells_csv(study_dir / CELLS_CSV, results["cells"])]
    files.append(_write_csv(study_dir / RESULTS_CSV, results))
    md = study_dir / RESULTS_MD
    atomic_write_text(md, markdown(results))
    return [*files, md]


#: The columns of ``study.csv`` that only its ``difference`` rows fill (the paired comparisons).
COMPARISON_FIELDS = ("same", "above", "below", "ci_low", "ci_high", "test", "p", "p_holm", "mde", "verdict")


def csv_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """``study.csv``: ``setting`` rows (setting, kind, scale, metric), then ``difference`` rows per comparison."""
    keys = [a["key"] for a in results["definition"]["axes"]]
    rows = []
    for entry in results["settings"]:
        base = {
            "setting": entry["setting"],
            "config": Path(entry["config"]).name,
            **{k: entry["values"].get(k) for k in keys},
        }
        groups = [("val", None, None, entry["main"])]
        groups += [(kind, r["scale"], r["size"], r) for kind in KINDS for r in entry[kind]]
        groups += [(f"padding:{mode}", None, None, {"AP": agg}) for mode, agg in entry["padding"]["AP"].items()]
        for kind, scale, size, stats in groups:
            for stat in STATS:
                if stat in stats:
                    agg = stats[stat]
                    rows.append(
                        {
                            **base,
                            "row": "setting",
                            "reference": None,
                            "kind": kind,
                            "scale": scale,
                            "size": size,
                            "metric": stat,
                            "unit": UNIT,
                            "mean": agg["mean"],
                            "std": agg["std"],
                            "n": agg["n"],
                            "values": ";".join(repr(v) for v in agg["values"]),
                            **dict.fromkeys(COMPARISON_FIELDS),
                        }
                    )
    entries = {e["setting"]: e for e in results["settings"]}
    for c in results.get("comparisons", {}).get("rows", []):
        entry = entries[c["setting"]]
        rows.append(
            {
                "setting": c["setting"],
                "config": Path(entry["config"]).name,
                **{k: entry["values"].get(k) for k in keys},
                "row": "difference",
                "reference": c["reference"],
                "kind": f"padding:{c['mode']}" if c["kind"] == "padding" else c["kind"],
                "scale": c["scale"],
                "size": None,
                "metric": "AP",
                "unit": results["comparisons"]["unit"],
                "mean": c["mean"],
                "std": c["sd"],
                "n": c["n"],
                "values": ";".join(repr(v) for v in c["differences"]),
                "same": ";".join(c.get("same", [])) or None,
                "above": c["above"],
                "below": c["below"],
                "ci_low": c["ci"][0] if c["ci"] else None,
                "ci_high": c["ci"][1] if c["ci"] else None,
                **{k: c[k] for k in ("test", "p", "p_holm", "mde")},
                "verdict": verdict_text(c, results["comparisons"]["equal_within"]),
            }
        )
    return rows


def _write_csv(path: Path, results: dict[str, Any]) -> Path:
    return atomic_write_text(path, csv_text(results))


def csv_text(results: dict[str, Any]) -> str:
    """``study.csv``: a header, then :func:`csv_rows`."""
    rows = csv_rows(results)
    keys = [a["key"] for a in results["definition"]["axes"]]
    fields = [
        "setting",
        "config",
        *keys,
        "row",
        "reference",
        "kind",
        "scale",
        "size",
        "metric",
        "unit",
        "mean",
        "std",
        "n",
        "values",
        *COMPARISON_FIELDS,
    ]
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def cells_lost(study_dir: Path, results: dict[str, Any]) -> list[str]:
    """The cells ``study.json`` reports done that ``results`` no longer has done (a redraw drops none silently)."""
    try:
        earlier = read_report_cells(study_dir / RESULTS_JSON) or []
    except UserError:
        return []
    done = {cell["name"] for cell in earlier if cell["status"] == "done"}
    return sorted(done - {cell["name"] for cell in results["cells"] if cell["status"] == "done"})


def _pending(records: Sequence[dict[str, Any]]) -> str:
    """``52 not started, 2 interrupted``: the cells not done, by status; empty when every cell is done."""
    counts = Counter(cell["status"] for cell in records if cell["status"] != "done")
    return ", ".join(f"{n} {status}" for status, n in counts.most_common())


def progress_line(results: dict[str, Any]) -> str:
    """``14 of 24 cells done; 2 running, 8 not started`` (``stopped`` for a running cell whose process is gone)."""
    done = sum(cell["status"] == "done" for cell in results["cells"])
    rest = _pending(results["cells"])
    return f"{done} of {len(results['cells'])} cells done" + (f"; {rest}" if rest else "")


def format_stat(agg: dict[str, Any], digits: int = 1) -> str:
    """``62.5 ± 1.2`` (mean ± std with ``digits`` decimals); ``62.5`` with one seed; ``n/a`` without values."""
    if agg["mean"] is None:
        return "n/a"
    text = f"{agg['mean']:.{digits}f}"
    return text + (f" ± {agg['std']:.{digits}f}" if agg["std"] is not None else "")


def markdown(results: dict[str, Any]) -> str:
    """``study.md``, each table in a ``pymdownx.snippets`` section (:data:`SECTIONS`) for documentation pages."""
    d = results["definition"]
    settings = results["settings"]
    axes = ", ".join(a["key"] for a in d["axes"]) or "none"
    lines = [
        "# Study results",
        "",
        (
            f"Base configs: {', '.join(Path(c).name for c in d['configs'])}; axes: {axes}; "
            f"seeds per setting: {d['seeds']}; overrides: {' '.join(d['overrides']) or 'none'}."
        ),
        "COCO bbox metrics in percent, mean ± sample standard deviation over the seeds (n = seeds done).",
        *section(
            "progress",
            [
                f"Cells: {progress_line(results)}.",
                *([results["seeds_auto"]["stopped"]] if results.get("seeds_auto") else []),
            ],
        ),
        *comparison_lines(results),
        "",
        "## At the configured validation size",
        *section(
            "validation",
            [
                "| setting | n | " + " | ".join(STATS) + " |",
                "|---|---|" + "---|" * len(STATS),
                *(
                    f"| {e['setting']} | {e['main']['AP']['n']} | "
                    + " | ".join(format_stat(e["main"][s]) for s in STATS)
                    + " |"
                    for e in settings
                ),
            ],
        ),
    ]
    for kind in KINDS:
        lines += scale_lines(settings, kind)
    lines += padding_lines(settings)
    lines += cost_lines(settings)
    unfinished = [c for c in results["cells"] if c["status"] != "done"]
    if unfinished:
        lines += ["", "## Cells not done", "", "| cell | status | error |", "|---|---|---|"]
        lines += [f"| {c['name']} | {c['status']} | {(c['error'] or '').replace('|', '/')} |" for c in unfinished]
    return "\n".join(lines) + "\n"


#: The named sections of ``study.md`` (its progress lines and its tables), for ``--8<-- "PATH/study.md:NAME"``
#: on a documentation page.
SECTIONS = ("progress", "comparisons", "validation", *KINDS, "padding", "cost")


def section(name: str, table: Sequence[str]) -> list[str]:
    """Lines between the markers of the ``pymdownx.snippets`` section ``name``."""
    return ["", f"<!-- --8<-- [start:{name}] -->", "", *table, "", f"<!-- --8<-- [end:{name}] -->"]


def scale_lines(settings: Sequence[dict[str, Any]], kind: str) -> list[str]:
    """The report's table of one kind of test scale (none when no cell measured it)."""
    if not any(e[kind] for e in settings):
        return []
    table = [f"| setting | scale | size | n | {' | '.join(STATS)} |", "|---|---|---|---|" + "---|" * len(STATS)]
    for e in settings:
        table += [f"| {e['setting']} | x{r['scale']:g} | {r.get('size') or 'n/a'} | {r['AP']['n']} | "
                  + " | ".join(format_stat(r[s]) for s in STATS) + " |" for r in e[kind]]  # fmt: skip
    return ["", f"## Test scales: {KIND_TITLES[kind]}", *section(kind, table)]


def padding_lines(settings: Sequence[dict[str, Any]]) -> list[str]:
    """The report's padding table: AP per evaluation mode, logit differences (none without padding cells)."""
    present = {m for e in settings for m in e["padding"]["AP"]}
    modes = [m for m in ("mixed", "single", "exact") if m in present] + sorted(present - {"mixed", "single", "exact"})
    if not modes:
        return []
    diff_keys = sorted({k for e in settings for k in e["padding"] if k.startswith("max_abs_logit_diff_")})
    titles = [k.removeprefix("max_abs_logit_diff_").replace("_vs_", " vs ") for k in diff_keys]
    table = [
        "| setting | " + " | ".join(f"AP {m}" for m in modes) + "".join(f" | logit diff {t}" for t in titles) + " |",
        "|---|" + "---|" * (len(modes) + len(titles)),
    ]
    for e in settings:
        pad = e["padding"]
        table.append(
            f"| {e['setting']} | "
            + " | ".join(format_stat(pad["AP"][m]) if m in pad["AP"] else "n/a" for m in modes)
            + "".join(f" | {pad[k]:.3g}" if k in pad else " | n/a" for k in diff_keys)
            + " |"
        )
    return [
        "",
        "## Padding sensitivity",
        "",
        "AP with evaluation batches that mix image sizes (mixed), one image at a time (single)"
        + (" and batches of equal sizes only (exact)" if "exact" in modes else "")
        + (
            f"; AP {PADDING_CHANGE}: each cell's AP in padded batches minus its AP one image at a time "
            "(negative: what padding costs it)"
            if PADDING_CHANGE in modes
            else ""
        )
        + "; the largest absolute logit difference between modes over all images and seeds.",
        *section("padding", table),
    ]


def cost_lines(settings: Sequence[dict[str, Any]]) -> list[str]:
    """The report's training-cost table per setting (none when no cell logged its times)."""
    if not any(e.get("cost", {}).get("iter_seconds", {}).get("n") for e in settings):
        return []
    lines = [
        "",
        "## Cost per cell",
        "",
        "What the training run cost (evaluations during training included, the study's evaluations after it not), "
        "mean ± sample standard deviation over the seeds: the iterations trained; the median of the logged "
        "iterations' times (moved less than the mean by short spells of other work on the machine, but raised by "
        "sustained load, as is the wall time); the run's wall time, summed over its resumed segments.",
    ]
    table = ["| setting | n | iterations | seconds per iteration | training wall time (min) |", "|---|---|---|---|---|"]
    for e in settings:
        cost = e.get("cost") or {}
        if not cost.get("iter_seconds", {}).get("n"):
            continue
        seconds = cost["iter_seconds"]
        table.append(
            f"| {e['setting']} | {seconds['n']} | {cost['iterations']['mean']:.0f} | {format_stat(seconds, 3)} | "
            f"{format_stat(cost['wall_minutes'])} |"
        )
    return lines + section("cost", table)


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}"


def _p(value: float | None) -> str:
    if value is None:
        return "n/a"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def _pairs_to_decide_sentence(tests: int) -> str:
    """How many pairs a row needs before it can be ahead or behind, given Holm's correction over ``tests``."""
    if tests == 0:
        return ""
    need = sign_flip_pairs_to_decide(tests)
    start = (
        "The sign-flip test's smallest p is 2/2^n (0.25 with 3 pairs); Holm's first step over the study's "
        f"{tests} tests asks the smallest p to be below {ALPHA:g}/{tests}"
    )
    if need < PERMUTATION_BELOW:
        return f"{start}, so ahead and behind need {need} pairs or more."
    return (
        f"{start}, which it cannot reach below {need} pairs, so no row can be ahead or behind below "
        f"{PERMUTATION_BELOW} pairs, where the paired t-test takes over."
    )


def comparison_lines(results: dict[str, Any]) -> list[str]:
    """The leading section of ``study.md``: every setting against the reference setting, seed by seed."""
    comparisons = results.get("comparisons")
    if not comparisons or comparisons["baseline"] is None:
        return []
    x = format_points(comparisons["equal_within"])
    rows = comparisons["rows"]
    tests = sum(r["p"] is not None for r in rows)
    lines = [
        "",
        f"## Paired comparisons with {comparisons['baseline']}",
        "",
        (
            "Each setting against the setting with the same other values and "
            f"{comparisons['baseline']} (the reference), seed by seed: the same seed has the same data order "
            "and augmentation and builds the model from the same random state; a seed missing in either "
            "setting is left out "
            "(n = seeds paired; above / below: the seeds whose difference is above / below zero). "
            "Difference = setting - reference, mean over the seeds, in AP points; "
            f"95% confidence interval from the t distribution; p two-sided, from an exact sign-flip "
            f"permutation test below {PERMUTATION_BELOW} pairs and a paired t-test from {PERMUTATION_BELOW} on, "
            f"Holm-corrected over the study's {tests} tests (a row whose AP is the "
            "same in every cell of both settings as an earlier row's is that row's test, and is named in it after "
            "'='); MDE: the smallest "
            f"difference a paired t-test at alpha {ALPHA:g} detects with {POWER:.0%} power given the spread of "
            f"the differences. Verdict: ahead / behind when the Holm-corrected p is below {ALPHA:g}; "
            f"equal within ±{x} AP when the whole interval lies within ±{x}; undecided otherwise. "
            + _pairs_to_decide_sentence(tests)
            + (
                f" AP padding {PADDING_CHANGE}: each cell's AP in padded batches minus its AP one image at a "
                "time; its difference is positive when padding costs the setting less than the reference."
                if any(r["kind"] == "padding" and r["mode"] == PADDING_CHANGE for r in rows)
                else ""
            )
        ),
    ]
    table = [
        "| setting | reference | metric | n | above / below | difference | 95% CI | test | p | p (Holm) | MDE | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ci = f"[{_signed(r['ci'][0])}, {_signed(r['ci'][1])}]" if r["ci"] else "n/a"
        table.append(
            f"| {r['setting']} | {r['reference']} | {row_title(r)} | {r['n']} | {r['above']} / {r['below']} | "
            f"{_signed(r['mean'])} | {ci} | "
            f"{r['test'] or 'n/a'} | {_p(r['p'])} | {_p(r['p_holm'])} | "
            f"{'n/a' if r['mde'] is None else format(r['mde'], '.2f')} | "
            f"{verdict_text(r, comparisons['equal_within'])} |"
        )
    return lines + section("comparisons", table)
