"""The studies shipped in ``docs/results/`` are what their cells' files say.

Each committed study folder (``plan.json`` with its cells' metrics and logs,
checkpoints left out) is read back exactly as ``detr-peg plot`` reads it, and
its committed ``study.md`` and ``study.csv`` must be the ones written from
those files: a table edited by hand, or cells changed without redrawing the
report, fails here. (The figures are drawn from the same results; their
pixels depend on the Matplotlib version and are not compared.)
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from detr_peg.study.comparisons import ComparisonOptions
from detr_peg.study.grid import StudyDefinition, expand_cells
from detr_peg.study.results import RESULTS_CSV, RESULTS_MD, collect, csv_text, markdown
from detr_peg.study.seed_rule import SeedRule
from detr_peg.study.stored_files import read_plan
from tests.conftest import REPO_ROOT

RESULTS = REPO_ROOT / "docs" / "results"
SHIPPED = sorted(p.parent for p in RESULTS.rglob("plan.json"))


def test_the_results_page_ships_studies() -> None:
    shipped = {p.relative_to(RESULTS).as_posix() for p in SHIPPED}
    assert {"proxy_curves", "v0.1.0/proxy_synthetic", "v0.1.0/proxy_multiscale"} <= shipped


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda p: p.relative_to(RESULTS).as_posix())
def test_a_shipped_report_is_the_one_its_cells_files_give(folder: Path) -> None:
    plan = read_plan(folder)
    definition = StudyDefinition.from_dict(plan["definition"])
    cells = expand_cells(definition)
    results = collect(
        folder,
        definition,
        cells,
        ComparisonOptions.from_dict(plan.get("comparison")),
        SeedRule.from_dict(plan.get("seeds_auto")),
    )
    assert sum(c["status"] == "done" for c in results["cells"]) > 0
    assert markdown(results) == (folder / RESULTS_MD).read_text(encoding="utf-8")
    with open(folder / RESULTS_CSV, newline="", encoding="utf-8") as f:
        shipped = list(csv.DictReader(f))
    rebuilt = list(csv.DictReader(io.StringIO(csv_text(results))))
    assert shipped == rebuilt
