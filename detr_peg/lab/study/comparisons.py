"""Paired comparisons of a study's settings with its reference setting, seed by seed, per AP row.

Differences in AP points: mean, 95% t interval, p (exact sign-flip below :data:`PERMUTATION_BELOW`
pairs, else paired t), Holm over the study, minimum detectable effect, verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy import optimize, stats

from detr_peg.errors import ConfigError
from detr_peg.lab.study.records import message_only, record

#: Two-sided significance level of the verdicts and of the minimum detectable effect.
ALPHA = 0.05
#: Power at which the minimum detectable effect is given.
POWER = 0.8
#: Below this many pairs the p-value is the exact sign-flip permutation test, from it on the paired t-test.
PERMUTATION_BELOW = 10
#: The padding row of AP in padded batches minus AP one image at a time (see :func:`cell_rows`).
PADDING_CHANGE = "mixed - single"
#: The names of the tests, as written in the reports.
PERMUTATION_TEST, T_TEST = "sign-flip permutation (exact)", "paired t"
#: The metric every comparison row is about.
METRIC = "AP"
#: The key of ``--baseline config=FILE``: the base configs as an axis.
CONFIG_KEY = "config"


@dataclass(frozen=True)
class ComparisonOptions:
    """How a report compares settings: ``baseline`` ``KEY=VALUE`` (None: the default), ``equal_within`` AP points."""

    baseline: str | None = None
    equal_within: float = 1.0
    baseline_source: str = message_only("--baseline")

    def to_dict(self) -> dict[str, Any]:
        return record(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ComparisonOptions:
        data = data or {}
        return cls(baseline=data.get("baseline"), equal_within=float(data.get("equal_within", 1.0)))


def parse_equal_within(text: str, flag: str = "--equal-within") -> float:
    """A positive, finite number of AP points; ``ConfigError`` otherwise."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{flag} must be a positive number of AP points (for example 1.0), got {text!r}.")
    return value


# ----------------------------------------------------------------------------- statistics


def paired_statistics(differences: Sequence[float]) -> dict[str, Any]:
    """``{"n", "mean", "above", "below", "sd", "ci", "half_width", "test", "p", "mde"}`` of per-seed differences.

    Below two differences everything but ``n``, ``mean``, ``above``, ``below`` is None (``mean`` too without any).
    """
    d = np.asarray(differences, dtype=float)
    n = len(d)
    out: dict[str, Any] = {
        "n": n,
        "mean": float(d.mean()) if n else None,
        "above": int((d > 0).sum()),
        "below": int((d < 0).sum()),
        "sd": None,
        "ci": None,
        "half_width": None,
        "test": None,
        "p": None,
        "mde": None,
    }
    if n < 2:
        return out
    sd = float(d.std(ddof=1))
    if sd <= 1e-9 * max(1.0, abs(out["mean"])):  # equal differences up to rounding (file values, float sums)
        sd = 0.0
    out["sd"] = sd
    if sd > 0:
        # ttest_rel(d, 0) is the paired t-test of (setting, reference): only the differences enter it.
        result = stats.ttest_rel(d, np.zeros(n))
        interval = result.confidence_interval(1 - ALPHA)
        out["ci"] = [float(interval.low), float(interval.high)]
        t_p = float(result.pvalue)
    else:  # every seed moved by the same amount: no spread, a point interval
        out["ci"] = [out["mean"], out["mean"]]
        t_p = 1.0 if out["mean"] == 0 else 0.0
    out["half_width"] = (out["ci"][1] - out["ci"][0]) / 2
    if n < PERMUTATION_BELOW:
        perm = stats.permutation_test(
            (d, np.zeros(n)),
            lambda x, y, axis: np.mean(x - y, axis=axis),
            permutation_type="samples",  # swapping a pair's members flips the sign of its difference
            alternative="two-sided",
            n_resamples=np.inf,  # all 2**n sign patterns: exact
        )
        out["test"], out["p"] = PERMUTATION_TEST, float(perm.pvalue)
    else:
        out["test"], out["p"] = T_TEST, t_p
    out["mde"] = minimum_detectable_effect(sd, n)
    return out


def minimum_detectable_effect(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The true mean difference a two-sided paired t-test of ``n`` pairs detects with probability ``power``.

    0 when ``sd`` is 0; None below two pairs.
    """
    if n < 2:
        return None
    if sd <= 0:
        return 0.0
    df = n - 1
    critical = stats.t.ppf(1 - alpha / 2, df)

    def shortfall(effect: float) -> float:
        nc = effect * math.sqrt(n) / sd
        # The far tail on the wrong side is negligible for a positive effect; scipy may return nan for it.
        wrong_side = float(np.nan_to_num(stats.nct.cdf(-critical, df, nc), nan=0.0))
        return float(stats.nct.sf(critical, df, nc)) + wrong_side - power

    upper = sd
    while shortfall(upper) < 0:
        upper *= 2
    return float(optimize.brentq(shortfall, 0.0, upper, xtol=1e-10 * sd))


def seeds_for_half_width(sd: float | None, target: float) -> int:
    """The fewest pairs whose 95% t interval has half-width at most ``target`` for differences of spread ``sd``."""
    if not sd:
        return 2
    n = 2
    while stats.t.ppf(1 - ALPHA / 2, n - 1) * sd / math.sqrt(n) > target:
        n += 1
    return n


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``pvalues``, in the input order."""
    m = len(pvalues)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * pvalues[index]))
        adjusted[index] = running
    return adjusted


def verdict(row: dict[str, Any], equal_within: float) -> str:
    """``ahead``, ``behind``, ``equal`` or ``undecided``.

    ``ahead``/``behind`` when ``p_holm`` < ALPHA; else ``equal`` when the interval lies within ``±equal_within``.
    """
    if row["p_holm"] is not None and row["p_holm"] < ALPHA and row["mean"] != 0:
        return "ahead" if row["mean"] > 0 else "behind"
    if row["ci"] is not None and -equal_within <= row["ci"][0] and row["ci"][1] <= equal_within:
        return "equal"
    return "undecided"


def sign_flip_pairs_to_decide(tests: int) -> int:
    """The fewest pairs with which the sign-flip test (p >= ``2 / 2**n``) can pass Holm over ``tests`` tests."""
    n = 1
    while 2.0 / 2**n * max(tests, 1) >= ALPHA:
        n += 1
    return n


def format_points(value: float) -> str:
    """AP points of a threshold as the reports write them: ``1.0``, ``0.5``, ``0.25``."""
    return f"{value:.1f}" if round(value, 1) == value else f"{value:g}"


def verdict_text(row: dict[str, Any], equal_within: float) -> str:
    """The verdict as the report writes it: ``equal within ±1.0 AP`` for ``equal``."""
    return f"equal within ±{format_points(equal_within)} AP" if row["verdict"] == "equal" else row["verdict"]


# ----------------------------------------------------------------------------- the reference setting


def reference(definition: dict[str, Any], baseline: str | None, source: str = "--baseline") -> tuple[str, str] | None:
    """``(key, value)`` of the reference setting as written in the cells, or None for a single setting.

    ``baseline``: ``KEY=VALUE`` with KEY an axis key (or its last part) or ``config``; VALUE compared as YAML.
    Raises ``ConfigError`` listing the valid keys or values.
    """
    axes = {a["key"]: list(a["values"]) for a in definition.get("axes", [])}
    configs = list(definition["configs"])
    if baseline is None:  # the first axis that has two values or more, the base configs last
        for key, values in axes.items():
            if len(values) > 1:
                return key, values[0]
        return (CONFIG_KEY, configs[0]) if len(configs) > 1 else None
    key, sep, value = baseline.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key or not value:
        raise ConfigError(f"{source} {baseline!r} is not of the form KEY=VALUE (for example model.position.name=sine).")
    if key == CONFIG_KEY:
        if len(configs) == 1:
            raise ConfigError(f"{source} {baseline}: the study has a single base config; choose an axis instead.")
        for config in configs:
            if value in (config, Path(config).name, Path(config).stem) or Path(value).resolve() == Path(config):
                return CONFIG_KEY, config
        raise ConfigError(
            f"{source} {baseline}: no base config {value!r}; the study's are "
            f"{', '.join(Path(c).name for c in configs)}."
        )
    matches = [k for k in axes if k == key] or [k for k in axes if k.split(".", 1)[-1] == key]
    if len(matches) != 1:
        valid = ", ".join([*axes, *([CONFIG_KEY] if len(configs) > 1 else [])]) or "none"
        raise ConfigError(f"{source} {baseline}: {key!r} is not one of the study's axes ({valid}).")
    key = matches[0]
    if len(axes[key]) == 1:
        raise ConfigError(f"{source} {baseline}: {key} has a single value; choose an axis with several values.")
    wanted = _yaml(value)
    for raw in axes[key]:
        if raw == value or _yaml(raw) == wanted:
            return key, raw
    raise ConfigError(f"{source} {baseline}: {value!r} is not a value of {key}; its values are {', '.join(axes[key])}.")


def _yaml(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


# ----------------------------------------------------------------------------- the study's comparisons


def ap_points_per_unit(unit: str | None) -> float:
    """AP points per unit of a study's numbers: 1 for ``"percent"``, 100 for fractions (no unit recorded)."""
    return 1.0 if unit == "percent" else 100.0


def cell_rows(cell: dict[str, Any]) -> dict[tuple[str, Any], float]:
    """``{(kind, scale or mode): AP}`` of one finished cell: ``val``, ``resized``, ``canvas``, ``padding``.

    ``("padding", PADDING_CHANGE)`` is AP in padded batches minus AP one image at a time (absent when equal);
    COCO's -1 is left out.
    """
    if cell["metrics"] is None:
        return {}
    rows: dict[tuple[str, Any], Any] = {("val", None): cell["metrics"].get(METRIC)}
    for kind in ("resized", "canvas"):
        for row in cell.get(kind) or []:
            rows[(kind, float(row["scale"]))] = row["metrics"].get(METRIC)
    for mode, result in ((cell.get("padding") or {}).get("modes") or {}).items():
        rows[("padding", mode)] = result["metrics"].get(METRIC)
    out = {k: float(v) for k, v in rows.items() if isinstance(v, (int, float)) and v >= 0}
    mixed, single = out.get(("padding", "mixed")), out.get(("padding", "single"))
    if mixed is not None and single is not None and mixed != single:
        out[("padding", PADDING_CHANGE)] = mixed - single
    return out


def row_label(kind: str, where: Any) -> str:
    """``AP``, ``AP resized x1.5``, ``AP canvas x2``, ``AP padding mixed``."""
    if kind == "val":
        return METRIC
    return f"{METRIC} {kind} x{where:g}" if kind in ("resized", "canvas") else f"{METRIC} {kind} {where}"


def row_title(row: dict[str, Any]) -> str:
    """A comparison row's label with the rows folded into it: ``AP (= resized x1, padding exact)``."""
    same = [label.removeprefix(f"{METRIC} ") for label in row.get("same", [])]
    return row["label"] + (f" (= {', '.join(same)})" if same else "")


def compare(results: dict[str, Any], options: ComparisonOptions) -> dict[str, Any]:
    """Every setting against its reference setting, seed by seed, for every AP row (``study.json``'s ``comparisons``).

    Returns ``{"baseline", "equal_within", "unit", "alpha", "power", "rows"}``; a row holds ``setting``,
    ``reference``, ``kind``, ``scale``/``mode``, ``label``, ``same`` (rows folded into it), ``seeds``,
    ``differences``, the :func:`paired_statistics`, ``p_holm`` and ``verdict``.
    """
    ref = reference(results["definition"], options.baseline, options.baseline_source)
    out: dict[str, Any] = {
        "baseline": None if ref is None else f"{ref[0]}={ref[1]}",
        "equal_within": options.equal_within,
        "unit": "AP points",
        "alpha": ALPHA,
        "power": POWER,
        "rows": [],
    }
    if ref is None:
        return out
    points = ap_points_per_unit(results.get("unit"))
    key, value = ref
    by_setting: dict[tuple, dict[str, Any]] = {}
    for cell in results["cells"]:
        ident = _identity(cell)
        entry = by_setting.setdefault(ident, {"setting": cell["setting"], "seeds": {}})
        entry["seeds"][cell["seed"]] = cell_rows(cell)
    rows = []
    for ident, entry in by_setting.items():
        if dict(ident)[key] == value:
            continue
        partner = by_setting.get(tuple((k, value if k == key else v) for k, v in ident))
        if partner is None:
            continue
        kinds = {k for seed in (*entry["seeds"].values(), *partner["seeds"].values()) for k in seed}
        all_seeds = sorted({*entry["seeds"], *partner["seeds"]})
        measured: dict[tuple, dict[str, Any]] = {}  # what each row measured, to fold rows that repeat one
        for kind, where in sorted(kinds, key=_row_order):
            values, paired = _measured(entry, partner, all_seeds, (kind, where))
            if paired and values in measured:  # nothing measured yet is not "the same"
                measured[values]["same"].append(row_label(kind, where))
                continue
            seeds = sorted(
                s
                for s, own in entry["seeds"].items()
                if (kind, where) in own and (kind, where) in partner["seeds"].get(s, {})
            )
            diffs = [points * (entry["seeds"][s][(kind, where)] - partner["seeds"][s][(kind, where)]) for s in seeds]
            row = {
                "setting": entry["setting"],
                "reference": partner["setting"],
                "kind": kind,
                "scale": where if kind in ("resized", "canvas") else None,
                "mode": where if kind == "padding" else None,
                "label": row_label(kind, where),
                "same": [],
                "seeds": seeds,
                "differences": diffs,
                **paired_statistics(diffs),
            }
            if paired:
                measured[values] = row
            rows.append(row)
    tested = [i for i, r in enumerate(rows) if r["p"] is not None]
    adjusted = holm([rows[i]["p"] for i in tested])
    for row in rows:
        row["p_holm"] = None
    for i, p in zip(tested, adjusted):
        rows[i]["p_holm"] = p
    for row in rows:
        row["verdict"] = verdict(row, options.equal_within)
    out["rows"] = rows
    return out


def _measured(entry: dict, partner: dict, seeds: Sequence[int], row: tuple[str, Any]) -> tuple[tuple, bool]:
    """Per seed ``(own AP, reference AP)`` or None for a row, and whether any seed has both."""
    values = tuple((entry["seeds"].get(s, {}).get(row), partner["seeds"].get(s, {}).get(row)) for s in seeds)
    return values, any(a is not None and b is not None for a, b in values)


def _identity(cell: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A setting as ``((config, path), (axis key, raw value), ...)``: what pairs it with its reference."""
    return ((CONFIG_KEY, cell["config"]), *cell["values"].items())


def _row_order(row: tuple[str, Any]) -> tuple[int, str, float]:
    kind, where = row
    order = ("val", "resized", "canvas", "padding").index(kind)
    return (order, str(where) if kind == "padding" else "", where if isinstance(where, float) else 0.0)
