"""Rule: a file a study wrote and reads back, damaged since, is one line naming it, the field and the value; exit 2.

The study's ``plan.json``, a cell's ``cell.json`` and its evaluation files
are read through one reader with declared shapes
(:mod:`detr_peg.lab.study.stored_files`). Each kind of damage below is applied to
each kind of file of a copy of a shipped study (real files), and ``detr-peg
plot`` must refuse it with one sentence, leaving every file as it was. (The shipped study
keeps one table of its cells; the copy gets its cells' files written back from it.)
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from detr_peg.cli.main import main
from tests.conftest import REPO_ROOT
from tests.lab.study.study_cells import write_cells_from_table
from tests.reliability.conftest import assert_outputs_kept, snapshot

SHIPPED = REPO_ROOT / "docs" / "results" / "proxy_synthetic"
CELL = "cells/deformable_small_position.name=peg_seed1"

#: Each file kind: its path in the study and how a message names it.
FILES = {
    "plan": ("plan.json", "Study plan"),
    "cell state": (f"{CELL}/cell.json", "Cell state"),
    "metrics": (f"{CELL}/eval/metrics.json", "Evaluation file"),
    "scales": (f"{CELL}/eval/scales_canvas.json", "Evaluation file"),
    "padding": (f"{CELL}/eval/padding.json", "Evaluation file"),
}


def _edit(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))

    return damage


#: A field of each file kind that the report reads.
READ_FIELD = {
    "plan": ("definition", "seeds"),
    "cell state": ("status",),
    "metrics": ("bbox", "AP"),
    "scales": ("results", 0, "metrics", "AP"),
    "padding": ("modes", "mixed", "metrics", "AP"),
}


def _set_read_field(value: object) -> Callable[[Path], None]:
    """Set the file's :data:`READ_FIELD` to ``value`` (``"1e999"`` as the bare JSON number, which is infinite)."""

    def damage(path: Path) -> None:
        kind = next(k for k, (relative, _) in FILES.items() if path.as_posix().endswith(relative))
        *parents, last = READ_FIELD[kind]
        data = json.loads(path.read_text())
        holder = data
        for key in parents:
            holder = holder[key]
        holder[last] = "__VALUE__"
        path.write_text(json.dumps(data).replace('"__VALUE__"', value if value == "1e999" else json.dumps(value)))

    return damage


#: Each damage: how it is made, and what the message says (after the file's name).
DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "cut short": (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "is not valid JSON"),
    "empty": (lambda p: p.write_bytes(b""), "is not valid JSON"),
    "not UTF-8": (lambda p: p.write_bytes(b'{"a": "caf\xe9"}'), "is not UTF-8 text"),
    "a list": (lambda p: p.write_text("[1, 2]"), ": the file is a list, not an object"),
    "a folder": (lambda p: (p.unlink(), p.mkdir()), "is a folder, not a file"),
    "nested too deeply": (lambda p: p.write_text("[" * 100_000 + "]" * 100_000), "nested"),
    "a field of the wrong type": (_set_read_field([1]), "is a list, not "),
    "an infinite number": (_set_read_field(float("inf")), "is Infinity, not "),
    "a number beyond any": (_set_read_field("1e999"), "is Infinity, not "),
}


def lambda_named(name: str, loss: Callable[[Path], None]) -> Callable[[Path], None]:
    """``loss`` under ``name`` (``cells``: every cell is lost; ``one``: one cell is)."""
    loss.__name__ = name
    return loss


@pytest.fixture
def study(tmp_path: Path) -> Path:
    folder = tmp_path / "study"
    shutil.copytree(SHIPPED, folder)
    write_cells_from_table(folder)
    assert main(["plot", str(folder)]) == 0  # the report and the folder's records, as a finished study has them
    return folder


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("kind", FILES)
def test_a_damaged_study_file_is_one_line_and_nothing_changes(study: Path, kind: str, damage: str, capsys) -> None:
    relative, what = FILES[kind]
    make, says = DAMAGES[damage]
    path = study / relative
    make(path)
    before = snapshot(study)
    assert main(["plot", str(study)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(f"detr-peg plot: error: {what} {path}"), err[0]
    assert says in err[0], err[0]
    assert_outputs_kept(before, study)


@pytest.mark.parametrize(
    ("kind", "change", "says"),
    [
        ("plan", lambda d: d["definition"].pop("configs"), "Study plan {path}: definition has no field 'configs'"),
        ("plan", lambda d: d["definition"].update(seeds=0), "definition.seeds is 0, not from 1 to 10,000"),
        (
            "plan",
            lambda d: d["definition"]["axes"][0].update(values=5),
            "definition.axes[0].values is 5, not a list of at least 1 values",
        ),
        ("plan", lambda d: d["comparison"].update(equal_within=-1), "comparison.equal_within is -1, not above 0"),
        ("cell state", lambda d: d.update(status="bogus"), 'status is "bogus", not one of new, running, done,'),
        ("cell state", lambda d: d.update(error={"a": 1}), "error is an object, not a string"),
        ("metrics", lambda d: d.update(unit="furlongs"), 'unit is "furlongs", not one of percent'),
        ("metrics", lambda d: d.pop("unit"), "'AP' is"),  # percent without its unit
        ("scales", lambda d: d.pop("unit"), "above 1 for a fraction; percent needs 'unit': 'percent'"),
        ("scales", lambda d: d.pop("results"), "the file has no field 'results'"),
        ("padding", lambda d: d.update(modes=[1]), "modes is a list, not an object"),
    ],
)
def test_a_field_out_of_shape_is_named_with_its_value(study: Path, kind: str, change, says: str, capsys) -> None:
    path = study / FILES[kind][0]
    _edit(change)(path)
    before = snapshot(study)
    assert main(["plot", str(study)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says.format(path=path) in err[0], err
    assert_outputs_kept(before, study)


def test_the_intact_copy_is_drawn(study: Path, capsys) -> None:
    """The damage, not the copy, is what the tests above refuse."""
    assert main(["plot", str(study)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"Study {study}: ")


@pytest.mark.parametrize(
    "loss",
    [
        lambda_named("cells", lambda study: shutil.rmtree(study / "cells")),
        lambda_named("cells", lambda study: (study / "cells").rename(study / "cells-moved")),
        lambda_named("one", lambda study: shutil.rmtree(study / CELL)),
        lambda_named("one", lambda study: _edit(lambda d: d.update(status="failed"))(study / CELL / "cell.json")),
    ],
    ids=["cells-deleted", "cells-moved", "one-cell-deleted", "one-cell-rewritten"],
)
def test_a_redraw_never_drops_cells_the_report_has_done(study: Path, loss, capsys) -> None:
    reported = json.loads((study / "study.json").read_text())["cells"]
    done_before = sum(cell["status"] == "done" for cell in reported)
    (study / "cells.csv").unlink()  # with the table, a deleted cell folder is drawn from its row
    loss(study)
    before = snapshot(study)
    assert main(["plot", str(study)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"detr-peg plot: error: {study / 'study.json'} reports cells done"), err
    assert "cell.json); restore them, or delete" in err[0]
    assert_outputs_kept(before, study)
    # Said so, by deleting the report, the redraw draws what is there.
    (study / "study.json").unlink()
    assert main(["plot", str(study)]) == 0
    done = json.loads((study / "study.json").read_text())["cells"]
    left = 0 if "cells" in loss.__name__ else done_before - 1  # every cell, or the one that was lost
    assert sum(cell["status"] == "done" for cell in done) == left


def test_a_baseline_in_the_plan_that_names_no_setting_is_named_in_the_plan(study: Path, capsys) -> None:
    _edit(lambda d: d["comparison"].update(baseline="nope=1"))(study / "plan.json")
    before = snapshot(study)
    assert main(["plot", str(study)]) == 2
    said = "'nope' is not one of the study's axes (model.position.name, config)."
    assert (
        capsys.readouterr().err.strip()
        == f"detr-peg plot: error: {study / 'plan.json'}: comparison.baseline nope=1: {said}"
    )
    assert main(["plot", str(study), "--baseline", "nope=2"]) == 2
    assert capsys.readouterr().err.strip() == f"detr-peg plot: error: --baseline nope=2: {said}"
    assert_outputs_kept(before, study)


def test_the_cell_table_alone_draws_the_same_report(study: Path, tmp_path: Path) -> None:
    """What a shipped study keeps (plan.json, cells.csv) redraws the report its cells' files gave."""
    shipped = tmp_path / "shipped"
    assert main(["plot", str(study), "--publish", str(shipped)]) == 0
    assert not (shipped / "cells").exists()
    for name in ("study.md", "study.csv"):
        assert (shipped / name).read_bytes() == (study / name).read_bytes(), name
    assert main(["plot", str(shipped)]) == 0  # and again from the table alone
    assert (shipped / "study.md").read_bytes() == (study / "study.md").read_bytes()


@pytest.mark.parametrize(
    "edit",
    [
        lambda text: text.replace("resized x1.0 AP,", "resized x1.0,", 1),
        lambda text: text.replace("cost iterations,", "cost,", 1),
        lambda text: text.replace('"{""model.position.name"": ""peg""}"', "[]", 1),
        lambda text: text.replace(",done,", ",done,,,[1],", 1),
    ],
    ids=["scale-column-without-field", "bare-cost-column", "values-not-an-object", "shifted-row"],
)
def test_a_damaged_cell_table_is_one_line(tmp_path: Path, edit, capsys) -> None:
    study = tmp_path / "study"
    shutil.copytree(SHIPPED, study)
    assert main(["plot", str(study)]) == 0  # the folder's records, as a drawn study has them
    capsys.readouterr()
    path = study / "cells.csv"
    path.write_text(edit(path.read_text()))
    before = snapshot(study)
    assert main(["plot", str(study)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"detr-peg plot: error: Cell table {path}, line"), err
    assert_outputs_kept(before, study)
