"""Paired comparisons in a study's report, checked against scipy.stats computed here from the cells' own numbers.

The cells' metrics files are written by the tests (no training); every number
of the report is recomputed independently: the per-seed differences, the t
interval (:func:`scipy.stats.ttest_rel`), the p-values (the exact sign-flip
test as :func:`scipy.stats.permutation_test` of the differences alone, and
the paired t-test), Holm's correction and the power at the minimum
detectable effect.
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from detr_peg.cli.main import main
from detr_peg.errors import ConfigError
from detr_peg.lab.study.comparisons import ComparisonOptions, holm, reference
from detr_peg.lab.study.grid import EvalPlan, StudyDefinition, expand_cells, parse_axis
from detr_peg.lab.study.results import collect, write_results
from detr_peg.lab.study.runner import plan_record
from detr_peg.lab.study.stored_files import PLAN_FILE
from tests.lab.study.study_cells import write_done_cell

ROWS = [("val", None), ("resized", 1.5), ("canvas", 2.0), ("padding", "mixed"), ("padding", "single")]
LABELS_OF_ROWS = ["AP", "AP resized x1.5", "AP canvas x2", "AP padding mixed", "AP padding single"]
#: The report's rows: the cells' own, and what padding changes (AP mixed - AP single), ordered by mode.
LABELS = ["AP", "AP resized x1.5", "AP canvas x2", "AP padding mixed", "AP padding mixed - single", "AP padding single"]


def make_study(folder: Path, axis: str, seeds: int, ap, *, skip=(), eval_plan=None) -> tuple:
    """A study folder whose cells hold ``ap(cell)`` (a dict of AP rows, fractions); cells in ``skip`` are absent."""
    definition = StudyDefinition(
        configs=("base.yaml",),
        axes=(parse_axis(axis),),
        seeds=seeds,
        eval=eval_plan or EvalPlan(scales=(1.5,), canvas_scales=(2.0,), padding=True),
    )
    cells = expand_cells(definition)
    for cell in cells:
        if cell.name not in skip:
            write_done_cell(folder, cell, ap(cell))
    (folder / PLAN_FILE).write_text(json.dumps(plan_record(folder, definition, cells)))
    return definition, cells


def holm_reference(p: list[float]) -> list[float]:
    """Holm's adjustment written another way: sorted, scaled by (m - i), running maximum, clipped, unsorted."""
    p = np.asarray(p)
    order = np.argsort(p)
    scaled = np.minimum(1.0, np.maximum.accumulate((len(p) - np.arange(len(p))) * p[order]))
    out = np.empty_like(scaled)
    out[order] = scaled
    return out.tolist()


def sign_flip_p(d: np.ndarray) -> float:
    """The exact sign-flip p-value from scipy on the differences alone (one sample, signs flipped)."""
    result = stats.permutation_test(
        (d,), lambda x, axis: np.mean(x, axis=axis), permutation_type="samples", n_resamples=np.inf
    )
    return float(result.pvalue)


def test_holm_matches_its_definition() -> None:
    p = [0.01, 0.04, 0.03, 0.2, 0.001, 0.04]
    assert holm(p) == pytest.approx(holm_reference(p))
    assert holm([0.5, 0.9]) == [1.0, 1.0]


def test_every_row_is_the_paired_difference_with_scipy_interval_p_and_holm(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    seeds = 4
    # Per seed, a shared level (what the seed's initialisation and data order do to every setting) plus an
    # effect per setting and row and a little noise of the cell's own.
    level = {s: rng.normal(0.30, 0.03) for s in range(seeds)}
    effect = {"sine": 0.0, "peg": 0.02, "learned": -0.01}
    noise = {(name, s, row): rng.normal(0, 0.004) for name in effect for s in range(seeds) for row in ROWS}

    def ap(cell):
        name = dict(cell.values)["model.position.name"]
        return {row: level[cell.seed] + effect[name] + noise[(name, cell.seed, row)] for row in ROWS}

    definition, cells = make_study(tmp_path, "model.position.name=sine,peg,learned", seeds, ap)
    results = collect(tmp_path, definition, cells)
    write_results(tmp_path, results)
    comparisons = results["comparisons"]
    assert comparisons["baseline"] == "model.position.name=sine"  # the first value of the first axis
    rows = comparisons["rows"]
    assert [(r["setting"], r["label"]) for r in rows] == [
        (f"position.name={name}", label) for name in ("peg", "learned") for label in LABELS
    ]
    raw_p = []
    for r in rows:
        name = r["setting"].split("=")[1]
        x = np.array([row_value(tmp_path, cells, name, s, r["label"]) for s in range(seeds)])
        y = np.array([row_value(tmp_path, cells, "sine", s, r["label"]) for s in range(seeds)])
        d = 100 * (x - y)  # AP points
        assert r["reference"] == "position.name=sine" and r["n"] == seeds and r["seeds"] == [0, 1, 2, 3]
        assert r["differences"] == pytest.approx(d.tolist())
        assert r["mean"] == pytest.approx(d.mean())
        assert (r["above"], r["below"]) == (int(np.sum(d > 0)), int(np.sum(d < 0)))
        t = stats.ttest_rel(100 * x, 100 * y)  # the interval of x - y
        ci = t.confidence_interval(0.95)
        assert r["ci"] == pytest.approx([ci.low, ci.high])
        assert r["half_width"] == pytest.approx((ci.high - ci.low) / 2)
        assert r["test"] == "sign-flip permutation (exact)"  # n < 10
        assert r["p"] == pytest.approx(sign_flip_p(d))
        # The same p by counting all 2**n sign patterns whose |mean| reaches the observed one.
        flips = [abs(np.mean(d * np.array(signs))) for signs in itertools.product((1, -1), repeat=seeds)]
        assert r["p"] == pytest.approx(np.mean([f >= abs(d.mean()) - 1e-9 for f in flips]))
        # At the minimum detectable effect a paired t-test at 0.05 has 80% power.
        sd, df = d.std(ddof=1), seeds - 1
        nc = r["mde"] * np.sqrt(seeds) / sd
        crit = stats.t.ppf(0.975, df)
        assert stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc) == pytest.approx(0.8, abs=1e-6)
        raw_p.append(r["p"])
    assert [r["p_holm"] for r in rows] == pytest.approx(holm_reference(raw_p))

    md = (tmp_path / "study.md").read_text()
    assert md.index("## Paired comparisons with model.position.name=sine") < md.index("## At the configured")
    first = rows[0]
    line = (
        f"| position.name=peg | position.name=sine | AP | 4 | {first['above']} / {first['below']} | {first['mean']:+.2f} | "
        f"[{first['ci'][0]:+.2f}, {first['ci'][1]:+.2f}] | sign-flip permutation (exact) | {first['p']:.3f} | "
        f"{first['p_holm']:.3f} | {first['mde']:.2f} | "
    )
    assert line in md
    with open(tmp_path / "study.csv", newline="") as f:
        diffs = [r for r in csv.DictReader(f) if r["row"] == "difference"]
    assert len(diffs) == len(rows)
    assert float(diffs[0]["mean"]) == pytest.approx(first["mean"]) and diffs[0]["reference"] == "position.name=sine"
    assert (int(diffs[0]["above"]), int(diffs[0]["below"])) == (first["above"], first["below"])
    assert float(diffs[0]["p_holm"]) == pytest.approx(first["p_holm"]) and diffs[0]["kind"] == "val"
    assert [d["kind"] for d in diffs[3:6]] == ["padding:mixed", "padding:mixed - single", "padding:single"]
    stored = json.loads((tmp_path / "study.json").read_text())["comparisons"]
    assert stored["rows"][0]["p_holm"] == pytest.approx(first["p_holm"]) and stored["unit"] == "AP points"


def test_above_and_below_count_the_seeds_on_each_side_of_zero_and_leave_ties_out(tmp_path: Path) -> None:
    # peg - sine per seed: +1, -2, 0, +3 AP points at the validation size (a tie in seed 2).
    offsets = {0: 0.01, 1: -0.02, 2: 0.0, 3: 0.03}

    def ap(cell):
        peg = dict(cell.values)["model.position.name"] == "peg"
        return {row: 0.4 + 0.01 * cell.seed + (offsets[cell.seed] if peg else 0.0) for row in ROWS}

    definition, cells = make_study(tmp_path, "model.position.name=sine,peg", 4, ap)
    results = collect(tmp_path, definition, cells)
    write_results(tmp_path, results)
    row = results["comparisons"]["rows"][0]
    assert row["label"] == "AP" and row["differences"] == pytest.approx([1.0, -2.0, 0.0, 3.0])
    assert (row["above"], row["below"]) == (2, 1)
    line = next(x for x in (tmp_path / "study.md").read_text().splitlines() if x.startswith("| position.name=peg"))
    assert line.split(" | ")[4] == "2 / 1"
    with open(tmp_path / "study.csv", newline="") as f:
        diff = next(r for r in csv.DictReader(f) if r["row"] == "difference")
    assert (diff["above"], diff["below"]) == ("2", "1")


def test_no_padding_change_row_where_padded_batches_gave_the_ap_of_one_image_at_a_time(tmp_path: Path) -> None:
    # Batches of one image are never padded: "mixed" is "single" in every cell, and what padding changes is
    # not a measurement (the row would be zeros, one more test in Holm's correction).
    def ap(cell):
        value = 0.3 + 0.01 * cell.seed + (0.02 if dict(cell.values)["model.position.name"] == "peg" else 0.0)
        return {row: value for row in ROWS}

    definition, cells = make_study(tmp_path, "model.position.name=sine,peg", 3, ap)
    rows = collect(tmp_path, definition, cells)["comparisons"]["rows"]
    labels = [r["label"] for r in rows] + [label for r in rows for label in r["same"]]  # folded rows too
    assert "AP padding mixed" in labels and "AP padding single" in labels
    assert "AP padding mixed - single" not in labels


def row_value(folder: Path, cells, name: str, seed: int, label: str) -> float:
    """What a report row measured in one cell, from the cell's own files (the padding change: mixed - single)."""
    if label == "AP padding mixed - single":
        return ap_of(folder, cells, name, seed, "padding", "mixed") - ap_of(
            folder, cells, name, seed, "padding", "single"
        )
    return ap_of(folder, cells, name, seed, *dict(zip(LABELS_OF_ROWS, ROWS))[label])


def ap_of(folder: Path, cells, name: str, seed: int, kind: str, where) -> float:
    """One AP as the cell's own file holds it."""
    cell = next(c for c in cells if c.name == f"position.name={name}_seed{seed}")
    root = folder / "cells" / cell.name / "eval"
    if kind == "val":
        return json.loads((root / "metrics.json").read_text())["bbox"]["AP"]
    if kind == "padding":
        return json.loads((root / "padding.json").read_text())["modes"][where]["metrics"]["AP"]
    results = json.loads((root / f"scales_{kind}.json").read_text())["results"]
    return next(r for r in results if r["scale"] == where)["metrics"]["AP"]


#: Per-seed differences in AP points of each verdict's setting from the reference (8 seeds: the sign-flip test
#: reaches 2/256, below 0.05 after Holm's factor of 4).
VERDICT_DIFFS = {
    "ahead": [5.0, 4.2, 5.5, 6.1, 4.8, 5.3, 4.6, 5.9],
    "behind": [-3.0, -2.5, -3.4, -2.8, -3.1, -2.2, -3.6, -2.9],
    "equal": [0.1, -0.1, 0.2, -0.2, 0.1, -0.1, 0.05, -0.05],
    "undecided": [3.0, -2.0, 4.0, -3.0, 1.0, -4.0, 2.0, -1.0],
}


def verdict_study(folder: Path, skip=()) -> tuple:
    def ap(cell):
        name = dict(cell.values)["train.lr"]
        diff = 0.0 if name == "ref" else VERDICT_DIFFS[name][cell.seed]
        return {("val", None): 0.30 + 0.01 * cell.seed + diff / 100}

    return make_study(folder, "train.lr=ref,ahead,behind,equal,undecided", 8, ap, skip=skip, eval_plan=EvalPlan())


def test_verdicts_ahead_behind_equal_within_and_undecided(tmp_path: Path) -> None:
    definition, cells = verdict_study(tmp_path)
    results = collect(tmp_path, definition, cells)
    write_results(tmp_path, results)
    verdicts = {r["setting"].split("=")[1]: r for r in results["comparisons"]["rows"]}
    assert {name: r["verdict"] for name, r in verdicts.items()} == {n: n for n in VERDICT_DIFFS}
    assert verdicts["ahead"]["p"] == pytest.approx(2 / 2**8) and verdicts["ahead"]["p_holm"] < 0.05
    assert -1 <= verdicts["equal"]["ci"][0] and verdicts["equal"]["ci"][1] <= 1
    md = (tmp_path / "study.md").read_text()
    assert "| lr=equal | lr=ref | AP | 8 |" in md and "| equal within ±1.0 AP |" in md
    assert "| ahead |" in md and "| behind |" in md and "| undecided |" in md
    # A narrower threshold: the same interval is no longer inside it.
    narrow = collect(tmp_path, definition, cells, ComparisonOptions(equal_within=0.1))
    assert next(r for r in narrow["comparisons"]["rows"] if r["setting"] == "lr=equal")["verdict"] == "undecided"


def test_pairs_are_made_by_seed_and_a_missing_seed_is_left_out(tmp_path: Path) -> None:
    definition, cells = verdict_study(tmp_path, skip=("lr=ahead_seed2", "lr=ref_seed5"))
    rows = {r["setting"]: r for r in collect(tmp_path, definition, cells)["comparisons"]["rows"]}
    assert rows["lr=ahead"]["seeds"] == [0, 1, 3, 4, 6, 7] and rows["lr=ahead"]["n"] == 6
    kept = [VERDICT_DIFFS["ahead"][s] for s in (0, 1, 3, 4, 6, 7)]
    assert rows["lr=ahead"]["differences"] == pytest.approx(kept)  # not the mean of 7 minus the mean of 7
    assert rows["lr=behind"]["n"] == 7  # only the reference's seed 5 is missing
    write_results(tmp_path, collect(tmp_path, definition, cells))
    assert "| lr=ahead | lr=ref | AP | 6 |" in (tmp_path / "study.md").read_text()


def test_ten_pairs_or_more_use_the_paired_t_test(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    values = {(name, s): round(0.3 + rng.normal(0, 0.01), 6) for name in ("a", "b") for s in range(12)}
    definition, cells = make_study(
        tmp_path,
        "train.lr=a,b",
        12,
        lambda cell: {("val", None): values[(dict(cell.values)["train.lr"], cell.seed)]},
        eval_plan=EvalPlan(),
    )
    (row,) = collect(tmp_path, definition, cells)["comparisons"]["rows"]
    x = np.array([values[("b", s)] for s in range(12)])
    y = np.array([values[("a", s)] for s in range(12)])
    assert row["test"] == "paired t" and row["n"] == 12
    assert row["p"] == pytest.approx(stats.ttest_rel(100 * x, 100 * y).pvalue)
    assert row["p_holm"] == pytest.approx(row["p"])  # one test: nothing to correct


def test_baseline_is_chosen_by_key_and_value_and_a_wrong_one_is_refused(tmp_path: Path, capsys) -> None:
    definition, cells = verdict_study(tmp_path)
    d = definition.to_dict()
    assert reference(d, "train.lr=equal") == ("train.lr", "equal")
    assert reference(d, "lr=equal") == ("train.lr", "equal")  # the key as in the cell names
    with pytest.raises(ConfigError, match="not a value of train.lr; its values are ref, ahead"):
        reference(d, "train.lr=0.1")
    with pytest.raises(ConfigError, match="not one of the study's axes \\(train.lr\\)"):
        reference(d, "model.lr=ref")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        reference(d, "train.lr")
    two_axes = {**d, "axes": [*d["axes"], {"key": "train.epochs", "values": ["1"]}]}
    assert reference(two_axes, None) == ("train.lr", "ref")  # the first axis with several values
    with pytest.raises(ConfigError, match="train.epochs has a single value"):
        reference(two_axes, "train.epochs=1")
    with pytest.raises(ConfigError, match="single base config"):
        reference(d, "config=base.yaml")
    # The plot command rewrites the report against another reference setting.
    assert main(["plot", str(tmp_path), "--baseline", "train.lr=ahead", "--equal-within", "0.5"]) == 0
    md = (tmp_path / "study.md").read_text()
    assert "## Paired comparisons with train.lr=ahead" in md and "| lr=ref | lr=ahead | AP | 8 |" in md
    assert "equal within ±0.5 AP when the whole interval" in md
    assert main(["plot", str(tmp_path), "--baseline", "train.lr=fast"]) == 2
    assert "'fast' is not a value of train.lr" in capsys.readouterr().err


def test_a_single_setting_has_nothing_to_compare(tmp_path: Path) -> None:
    definition, cells = make_study(tmp_path, "train.lr=a", 2, lambda cell: {("val", None): 0.3}, eval_plan=EvalPlan())
    results = collect(tmp_path, definition, cells)
    assert results["comparisons"]["baseline"] is None and results["comparisons"]["rows"] == []
    write_results(tmp_path, results)
    assert "Paired comparisons" not in (tmp_path / "study.md").read_text()


def test_pairs_keep_the_other_axes_values(tmp_path: Path) -> None:
    """In a 2 x 2 grid, b is compared with a at each value of the other axis, never across it."""
    definition = StudyDefinition(
        configs=("base.yaml",), axes=(parse_axis("train.lr=a,b"), parse_axis("train.epochs=1,2")), seeds=3
    )
    cells = expand_cells(definition)
    effect = {("a", "1"): 0.0, ("b", "1"): 0.01, ("a", "2"): 0.10, ("b", "2"): 0.07}

    def ap(cell):
        v = dict(cell.values)
        return round(0.3 + effect[(v["train.lr"], v["train.epochs"])] + 0.001 * cell.seed**2, 6)

    for cell in cells:
        write_done_cell(tmp_path, cell, {("val", None): ap(cell)})
    rows = collect(tmp_path, definition, cells)["comparisons"]["rows"]
    assert [(r["setting"], r["reference"]) for r in rows] == [
        ("lr=b_epochs=1", "lr=a_epochs=1"),
        ("lr=b_epochs=2", "lr=a_epochs=2"),
    ]
    assert rows[0]["differences"] == pytest.approx([1.0] * 3) and rows[1]["differences"] == pytest.approx([-3.0] * 3)
    assert rows[0]["ci"] == pytest.approx([1.0, 1.0])  # no spread: a point interval


def test_rows_that_repeat_a_measurement_are_one_test(tmp_path: Path) -> None:
    """Resized x1 and padding exact give the validation size's AP in every cell (one image size): one row, one
    test in Holm's count; padding single differs in one cell of the reference and stays a row of its own."""
    rng = np.random.default_rng(11)
    seeds = 6
    base = {(name, s): round(0.3 + rng.normal(0, 0.02), 6) for name in ("sine", "peg") for s in range(seeds)}

    def ap(cell):
        name = dict(cell.values)["model.position.name"]
        value = base[(name, cell.seed)]
        single = value + (0.0001 if (name, cell.seed) == ("sine", 3) else 0.0)
        return {
            ("val", None): value,
            ("resized", 1.0): value,
            ("resized", 2.0): round(value / 3, 6),
            ("padding", "exact"): value,
            ("padding", "single"): single,
        }

    plan = EvalPlan(scales=(1.0, 2.0), padding=True)
    definition, cells = make_study(tmp_path, "model.position.name=sine,peg", seeds, ap, eval_plan=plan)
    results = collect(tmp_path, definition, cells)
    rows = results["comparisons"]["rows"]
    assert [(r["label"], r["same"]) for r in rows] == [
        ("AP", ["AP resized x1", "AP padding exact"]),
        ("AP resized x2", []),
        ("AP padding single", []),
    ]
    d = [100 * (base[("peg", s)] - base[("sine", s)]) for s in range(seeds)]
    assert rows[0]["differences"] == pytest.approx(d)
    assert [r["p_holm"] for r in rows] == pytest.approx(holm_reference([r["p"] for r in rows]))  # over 3 tests
    write_results(tmp_path, results)
    md = (tmp_path / "study.md").read_text()
    assert "| position.name=peg | position.name=sine | AP (= resized x1, padding exact) | 6 |" in md
    assert "Holm-corrected over the study's 3 tests" in md
    with open(tmp_path / "study.csv", newline="") as f:
        diffs = [r for r in csv.DictReader(f) if r["row"] == "difference"]
    assert [r["same"] for r in diffs] == ["AP resized x1;AP padding exact", "", ""]


def test_rows_of_a_comparison_not_measured_yet_are_not_folded(tmp_path: Path) -> None:
    """A setting with no finished cell has every row empty: nothing was paired, so no row is 'the same' (the
    reference's rows hold one AP, as if its cells had all been measured alike)."""
    values = {("val", None): 0.3, ("resized", 2.0): 0.3, ("padding", "mixed"): 0.3}
    definition, cells = make_study(
        tmp_path,
        "model.position.name=sine,peg",
        2,
        lambda cell: values,
        skip=("position.name=peg_seed0", "position.name=peg_seed1"),
        eval_plan=EvalPlan(scales=(2.0,), padding=True),
    )
    rows = collect(tmp_path, definition, cells)["comparisons"]["rows"]
    assert [(r["label"], r["same"], r["n"]) for r in rows] == [
        ("AP", [], 0),
        ("AP resized x2", [], 0),
        ("AP padding mixed", [], 0),
    ]


@pytest.mark.parametrize(
    ("others", "seeds", "tests", "need", "sentence"),
    [
        (1, 3, 6, 8, "so ahead and behind need 8 pairs or more."),
        (
            5,
            3,
            30,
            11,
            "which it cannot reach below 11 pairs, so no row can be ahead or behind below 10 pairs, where the "
            "paired t-test takes over.",
        ),
        (1, 1, 0, None, None),
    ],
)
def test_the_report_says_how_many_pairs_a_row_needs_to_pass_holms_correction(
    tmp_path: Path, others: int, seeds: int, tests: int, need: int | None, sentence: str | None
) -> None:
    """The sign-flip test's smallest p, scipy's for differences all of one sign, must pass Holm's first step over
    the study's tests: with 6 tests 8 pairs; with 30 it would take 11, so the report says no row can be ahead or
    behind below the 10 pairs where the paired t-test takes over; with one seed there is no test and no sentence."""
    names = ["sine", *[f"e{i}" for i in range(others)]]
    rng = np.random.default_rng(3)
    values = {
        (name, s, row): round(0.3 + rng.normal(0, 0.02), 6) for name in names for s in range(seeds) for row in ROWS
    }

    def ap(cell):
        return {row: values[(dict(cell.values)["model.position.name"], cell.seed, row)] for row in ROWS}

    definition, cells = make_study(tmp_path, "model.position.name=" + ",".join(names), seeds, ap)
    results = collect(tmp_path, definition, cells)
    write_results(tmp_path, results)
    assert sum(r["p"] is not None for r in results["comparisons"]["rows"]) == tests
    md = (tmp_path / "study.md").read_text()
    assert "need 6 pairs or more" not in md
    if need is None:
        assert "Holm-corrected over the study's 0 tests" in md  # the section is there, without the sentence
        assert "The sign-flip test's smallest p" not in md
        return
    # Independently: the fewest all-positive pairs whose exact sign-flip p, times the number of tests, is below 0.05.
    assert next(n for n in itertools.count(2) if sign_flip_p(np.ones(n)) * tests < 0.05) == need
    assert (
        "The sign-flip test's smallest p is 2/2^n (0.25 with 3 pairs); Holm's first step over the study's "
        f"{tests} tests asks the smallest p to be below 0.05/{tests}, {sentence}"
    ) in md
