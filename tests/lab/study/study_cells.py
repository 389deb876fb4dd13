"""Finished study cells written by the tests: the files of ``detr-peg train`` and ``detr-peg eval``, no training."""

from __future__ import annotations

import json
from pathlib import Path

from detr_peg.lab.study.cell import cell_paths, new_state, write_state
from detr_peg.lab.study.grid import Cell

STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")


def coco_stats(ap: float) -> dict[str, float]:
    """Twelve COCO numbers (fractions, as the files without a ``unit`` hold them) around one AP."""
    return {name: round(ap + i / 1000, 6) for i, name in enumerate(STAT_NAMES)}


def write_done_cell(study: Path, cell: Cell, ap: dict[tuple[str, object], float], config: dict | None = None) -> None:
    """A finished cell whose AP rows are ``ap``: ``{("val", None): 0.4, ("resized", 1.5): 0.3, ...}``.

    ``config`` is the resolved config recorded in ``cell.json`` (a rerun refuses a cell whose config changed).

    Kinds: ``val`` (``eval/metrics.json``), ``resized`` / ``canvas`` by scale (``eval/scales_*.json``),
    ``padding`` by mode (``eval/padding.json``).
    """
    paths = cell_paths(study, cell)
    paths.eval.mkdir(parents=True, exist_ok=True)
    paths.run.mkdir(parents=True, exist_ok=True)
    state = new_state(cell, config or {})
    state.update(status="done", stages={"train": "done", "eval": "done"})
    write_state(paths, state)
    (paths.eval / "metrics.json").write_text(json.dumps({"bbox": coco_stats(ap[("val", None)]), "num_images": 4}))
    for kind in ("resized", "canvas"):
        rows = [
            {"scale": where, "size": int(64 * where), "num_images": 4, "metrics": coco_stats(value)}
            for (k, where), value in ap.items()
            if k == kind
        ]
        if rows:
            (paths.eval / f"scales_{kind}.json").write_text(
                json.dumps({"kind": kind, "base_size": 64, "results": rows})
            )
    modes = {where: value for (k, where), value in ap.items() if k == "padding"}
    if modes:
        record = {"modes": {m: {"batch_size": 4, "metrics": coco_stats(v), "seconds": 1.0} for m, v in modes.items()}}
        (paths.eval / "padding.json").write_text(json.dumps(record))


def write_cells_from_table(study: Path) -> None:
    """The files of every done cell of a shipped study (``cells.csv``), as ``detr-peg study`` wrote them.

    The evaluation files and ``cell.json`` are written back from the table's records (the AP-against-iteration
    points as the ``eval`` records of ``run/metrics.jsonl``); what the cells cost is not.
    """
    from detr_peg.lab.study.grid import StudyDefinition, expand_cells
    from detr_peg.lab.study.stored_files import CELLS_CSV, read_cells_csv, read_plan

    records = read_cells_csv(study / CELLS_CSV)
    for cell in expand_cells(StudyDefinition.from_dict(read_plan(study)["definition"])):
        record = records.get(cell.name)
        if record is None or record["status"] != "done":
            continue
        paths = cell_paths(study, cell)
        paths.eval.mkdir(parents=True, exist_ok=True)
        paths.run.mkdir(parents=True, exist_ok=True)
        write_state(paths, {**new_state(cell, {}), "status": "done", "stages": {"train": "done", "eval": "done"}})
        (paths.eval / "metrics.json").write_text(json.dumps({"bbox": record["metrics"], "unit": "percent"}))
        for kind in ("resized", "canvas"):
            if record[kind]:
                data = {"kind": kind, "unit": "percent", "results": record[kind]}
                (paths.eval / f"scales_{kind}.json").write_text(json.dumps(data))
        if record["padding"]:
            (paths.eval / "padding.json").write_text(json.dumps(record["padding"]))
        curve = [{"type": "eval", "iteration": it, "AP": ap, "unit": "percent"} for it, ap in record["curve"]]
        (paths.run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))
