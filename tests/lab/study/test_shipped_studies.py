"""The studies shipped in ``docs/results/`` are what their cell tables say.

Each committed study folder (``plan.json``, ``cells.csv`` with one row per cell,
``study.md``, ``plots/``) is read back exactly as ``detr-peg plot`` reads it, and
its committed ``study.md`` must be the one written from ``cells.csv`` alone: a
table edited by hand, or cells changed without redrawing the report, fails here. (The figures are drawn from the same results; their
pixels depend on the Matplotlib version and are not compared.) The prose
that quotes a study's paired differences is held to the same files: every
"mean [low, high]" in a section of the Results page, or in the README's
Results section, must be a comparison row of a study shipped beside it,
and a p-value quoted after it in the same sentence ("p 0.0036",
"Holm-corrected 0.20") must be that row's; a metric named in the report's
words (`AP padding mixed - single`) must be one of its rows'.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from detr_peg.lab.study.cell import CELLS_DIR
from detr_peg.lab.study.comparisons import ComparisonOptions, row_title
from detr_peg.lab.study.grid import StudyDefinition, expand_cells
from detr_peg.lab.study.results import RESULTS_MD, collect, markdown
from detr_peg.lab.study.seed_rule import SeedRule
from detr_peg.lab.study.stored_files import CELLS_CSV, read_cells_csv, read_plan
from tests.conftest import REPO_ROOT

RESULTS = REPO_ROOT / "docs" / "results"
SHIPPED = sorted(p.parent for p in RESULTS.rglob("plan.json"))

#: A paired difference as the prose quotes it: the mean, then its 95% interval, ``-5.0 [-6.9, -3.0]`` or
#: ``-5.0 AP [-6.9, -3.0]``, at any number of decimals (line breaks count as spaces).
QUOTED_INTERVAL = re.compile(r"([+-]?\d+\.\d+)(?: AP)? \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]")
#: A p-value as the prose quotes it after an interval: ``p 0.0036``, ``sign-flip p 0.0625``, ``p = 0.125``.
QUOTED_P = re.compile(r"\bp (?:= )?(\d+\.\d+)")
#: Holm's corrected p-value as the prose quotes it: ``Holm-corrected 0.20``, ``Holm-corrected p 0.015``.
QUOTED_HOLM = re.compile(r"Holm-corrected (?:p )?(\d+(?:\.\d+)?)")
#: Where a sentence ends (a decimal point is followed by a digit, not a space).
SENTENCE_END = re.compile(r"\.\s")
#: A comparison's metric as the prose names it, in the report's words: ``AP padding mixed - single``,
#: ``AP (= resized x1, padding exact)``.
QUOTED_LABEL = re.compile(r"`(AP\w* [^`]+)`")
#: Where a section of a results page includes or links a study's report: ``--8<-- "docs/results/NAME/study.md:part"``
#: or ``[report](NAME/study.md)``.
INCLUDED_STUDY = re.compile(r'(?:--8<-- "docs/results/|\]\()([^"()]+)/study\.md')


def test_the_results_page_ships_studies() -> None:
    shipped = {p.relative_to(RESULTS).as_posix() for p in SHIPPED}
    assert {"proxy_curves", "v0.1.0/proxy_synthetic", "v0.1.0/proxy_multiscale"} <= shipped


def _results(folder: Path) -> dict:
    """The study's results as ``detr-peg plot`` reads them back."""
    plan = read_plan(folder)
    definition = StudyDefinition.from_dict(plan["definition"])
    return collect(
        folder,
        definition,
        expand_cells(definition),
        ComparisonOptions.from_dict(plan.get("comparison")),
        SeedRule.from_dict(plan.get("seeds_auto")),
    )


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda p: p.relative_to(RESULTS).as_posix())
def test_a_shipped_report_is_the_one_its_cell_table_gives(folder: Path) -> None:
    results = _results(folder)
    assert sum(c["status"] == "done" for c in results["cells"]) > 0
    assert not (folder / CELLS_DIR).exists()  # the report comes from cells.csv alone
    assert markdown(results) == (folder / RESULTS_MD).read_text(encoding="utf-8")
    assert read_cells_csv(folder / CELLS_CSV) == {c["name"]: c for c in results["cells"]}


def _quoted_intervals(text: str) -> list[tuple[str, str, str]]:
    return QUOTED_INTERVAL.findall(re.sub(r"\s+", " ", text))


def _rows(folders: list[Path]) -> list[dict]:
    """Every comparison row with an interval in the studies' reports."""
    rows = []
    for folder in folders:
        for row in _results(folder)["comparisons"]["rows"]:
            if row["mean"] is not None and row["ci"] and None not in row["ci"]:
                rows.append(row)
    return rows


def _as_quoted(value: float, like: str) -> str:
    """``value`` signed and rounded to the decimals of the quoted ``like``."""
    return f"{value:+.{len(like.partition('.')[2])}f}"


def _signed(text: str) -> str:
    return text if text[0] in "+-" else "+" + text


def _is_quoted(value: float, text: str) -> bool:
    return _as_quoted(value, text) == _signed(text)


def _gives(row: dict, interval: tuple[str, str, str]) -> bool:
    """Whether ``row``'s mean and interval, rounded to the quote's own decimals, are the quoted ``interval``."""
    return all(_is_quoted(v, t) for v, t in zip((row["mean"], *row["ci"]), interval))


def _unlisted(quoted: list[tuple[str, str, str]], rows: list[dict]) -> list[str]:
    """The quotes that no row gives."""
    return [f"{q[0]} [{q[1]}, {q[2]}]" for q in quoted if not any(_gives(row, q) for row in rows)]


def _unnamed(text: str, rows: list[dict]) -> list[str]:
    """The metrics named in the report's words in ``text`` that no row is titled with (as the report titles it)."""
    titles = {row_title(row) for row in rows}
    return [label for label in QUOTED_LABEL.findall(re.sub(r"\s+", " ", text)) if label not in titles]


def _quoted_p_values(text: str) -> list[tuple[tuple[str, str, str], list[str], list[str]]]:
    """Each quoted interval followed, in its sentence and before the next interval, by p-values:
    (the interval, its plain p-values, its Holm-corrected ones)."""
    text = re.sub(r"\s+", " ", text)
    intervals = list(QUOTED_INTERVAL.finditer(text))
    quotes = []
    for i, match in enumerate(intervals):
        tail = text[match.end() : intervals[i + 1].start() if i + 1 < len(intervals) else len(text)]
        end = SENTENCE_END.search(tail)
        tail = tail[: end.start()] if end else tail
        holm = QUOTED_HOLM.findall(tail)
        plain = QUOTED_P.findall(QUOTED_HOLM.sub("", tail))
        if holm or plain:
            quotes.append((match.groups(), plain, holm))
    return quotes


def _misquoted_p(quotes: list[tuple[tuple[str, str, str], list[str], list[str]]], rows: list[dict]) -> list[str]:
    """The quoted p-values that are not those of a row with the interval they follow."""
    bad = []
    for interval, plain, holm in quotes:
        if not any(
            _gives(row, interval)
            and all(_is_quoted(row["p"], q) for q in plain)
            and all(_is_quoted(row["p_holm"], q) for q in holm)
            for row in rows
        ):
            bad.append(f"{interval[0]} [{interval[1]}, {interval[2]}]: p {plain}, Holm-corrected {holm}")
    return bad


def _sections(text: str) -> list[str]:
    return re.split(r"(?m)^(?=## )", text)


def _readme_results() -> str:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    return next(s for s in _sections(readme) if s.startswith("## Results"))


RESULTS_SECTIONS = [
    section
    for page in ("index.md", "notebook.md")
    for section in _sections((RESULTS / page).read_text(encoding="utf-8"))
    if INCLUDED_STUDY.search(section) and _quoted_intervals(section)
]


def test_the_quote_check_finds_quotes_and_rounds_like_the_prose() -> None:
    # The check below only means something if it finds quotes: the multi-scale section quotes its rows.
    assert any("proxy_multiscale" in INCLUDED_STUDY.findall(s) for s in RESULTS_SECTIONS)
    # ... and the p-value check too: the multi-scale section quotes Holm-corrected values; README's Results
    # quotes intervals.
    assert any(holm for s in RESULTS_SECTIONS for _, _, holm in _quoted_p_values(s))
    assert _quoted_intervals(_readme_results())
    # ... and the label check: the synthetic section names a merged metric of its report.
    assert any(QUOTED_LABEL.search(s) for s in RESULTS_SECTIONS if "proxy_synthetic" in INCLUDED_STUDY.findall(s))
    assert _unlisted(
        [("-5.0", "-6.9", "-3.0"), ("0.31", "-1.20", "+1.83")], [{"mean": -4.96, "ci": [-6.93, -2.99]}]
    ) == ["0.31 [-1.20, +1.83]"]
    assert _unlisted([("0.31", "-1.20", "+1.83")], [{"mean": 0.3149, "ci": [-1.2, 1.8251]}]) == []
    merged = {"label": "AP", "same": ["AP resized x1", "AP padding exact"]}
    named = "such as `AP (= resized x1, padding exact)` or `AP (= resized x1,\n padding exact, padding single)`"
    assert _unnamed(named, [merged]) == ["AP (= resized x1, padding exact, padding single)"]
    assert _unnamed(named, [merged, {**merged, "same": [*merged["same"], "AP padding single"]}]) == []
    text = (
        "at 144 px -2.8 [-4.3, -1.2], `1 / 9`, p 0.0036, Holm-corrected 0.20: undecided. The\n"
        "other rows: -0.8 [-1.9, +0.2] and +1.5 [+0.5, +2.5] (Holm-corrected p 0.35). Then -0.1 [-0.2, +0.0]. p 0.9"
    )
    quotes = _quoted_p_values(text)
    assert quotes == [
        (("-2.8", "-4.3", "-1.2"), ["0.0036"], ["0.20"]),
        (("+1.5", "+0.5", "+2.5"), [], ["0.35"]),
    ]
    rows = [
        {"mean": -2.81, "ci": [-4.33, -1.24], "p": 0.00359, "p_holm": 0.2008},
        {"mean": 1.54, "ci": [0.54, 2.54], "p": 0.0068, "p_holm": 0.353},
    ]
    assert _misquoted_p(quotes, rows) == []
    rows[1]["p_holm"] = 0.506
    assert _misquoted_p(quotes, rows) == ["+1.5 [+0.5, +2.5]: p [], Holm-corrected ['0.35']"]


@pytest.mark.parametrize("section", RESULTS_SECTIONS, ids=lambda s: s.splitlines()[0].removeprefix("## "))
def test_the_results_page_quotes_rows_of_the_studies_it_includes(section: str) -> None:
    folders = [RESULTS / name for name in sorted(set(INCLUDED_STUDY.findall(section)))]
    rows = _rows(folders)
    assert _unlisted(_quoted_intervals(section), rows) == []
    assert _misquoted_p(_quoted_p_values(section), rows) == []
    # A metric named in the report's words is one of its rows' (a merged label changes as measurements part ways).
    assert _unnamed(section, rows) == []


def test_the_readme_quotes_rows_of_the_shipped_studies() -> None:
    results = _readme_results()
    quoted = _quoted_intervals(results)
    assert quoted
    rows = _rows(SHIPPED)
    assert _unlisted(quoted, rows) == []
    assert _misquoted_p(_quoted_p_values(results), rows) == []
    assert _unnamed(results, rows) == []
