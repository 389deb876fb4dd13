"""Redraw the figures of a study or of a single training run from the files they wrote.

A study folder (with plan.json): tables rewritten, figures drawn into STUDY/plots/,
with the paired comparisons (--baseline and --equal-within choose others). A run
folder (with metrics.jsonl): its learning curve into RUN/plots/learning_curve.pdf
and .png. --publish DEST writes plan.json and cells.csv (paths made relative) and
the report into DEST: a small copy that redraws everything and that detr-peg study resumes.

Examples:
  detr-peg plot studies/demo
  detr-peg plot studies/demo --baseline model.position.name=peg --equal-within 0.5
  detr-peg plot outputs/demo/run
  detr-peg plot studies/demo --publish docs/results/demo
"""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

from detr_peg.lab.study.command import add_comparison_arguments, comparison_options

#: Reads JSON and draws figures: neither torch nor the models are imported.
NEEDS_MODELS = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("path", metavar="RUN_OR_STUDY", help="a study folder or a training run folder")
    add_comparison_arguments(parser, recorded=True)  # a study's; by default those it was run with (plan.json)
    parser.add_argument("--publish", metavar="DEST",
                        help="write the study's plan.json and the rows of its done cells (cells.csv) into DEST and "
                             "draw the report there (publishing again adds the cells done since)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as claims:  # the output folders' claims, settled on leaving
        from detr_peg.errors import UserError
        from detr_peg.lab.study.plots import plot_run, plot_study
        from detr_peg.lab.study.stored_files import plot_io
        from detr_peg.outputs import guard_outputs

        path = Path(args.path)
        if not path.is_dir():
            problem = "is a file, not a folder" if path.exists() else "does not exist"
            raise UserError(f"RUN_OR_STUDY {path} {problem}; give a study folder or a training run folder.")
        study = os.path.lexists(path / "plan.json")  # a plan.json that cannot be read is named by its reader
        given = [option for option, value in (("--baseline", args.baseline), ("--equal-within", args.equal_within))
                 if value is not None]  # fmt: skip
        if given and not study:
            raise UserError(f"{' and '.join(given)} go with a study folder; {path} has no plan.json.")
        published = []
        if args.publish is not None:
            from detr_peg.lab.study.publish import plan_copy, write_copy
            from detr_peg.lab.study.stored_files import publish_io
            from detr_peg.outputs import check_no_overlap

            if not study:
                raise UserError(f"--publish copies a study: {path} is not a study folder (no plan.json).")
            io = publish_io(path, args.publish)
            check_no_overlap("plot", *io)  # STUDY itself, or a folder inside it, is refused as such
            copy = plan_copy(path, args.publish)  # every refusal comes before anything is written into DEST
            claims.enter_context(guard_outputs("plot", *io))
            write_copy(copy, args.publish)
            left = f"; {len(copy.left_out)} not done, left out" if copy.left_out else ""
            kept = f"; {len(copy.kept)} kept from the earlier copy though not done in {path}" if copy.kept else ""
            published = [
                f"Published {len(copy.copied)} done cells of {path} to {args.publish} ({len(copy.new)} new{left}{kept})."
            ]
            path = Path(args.publish)
        elif study or (path / "metrics.jsonl").is_file():
            claims.enter_context(guard_outputs("plot", *plot_io(path, study)))
        if study:
            from detr_peg.lab.study.grid import StudyDefinition, expand_cells
            from detr_peg.lab.study.results import cells_lost, collect, progress_line, write_results
            from detr_peg.lab.study.seed_rule import SeedRule
            from detr_peg.lab.study.stored_files import read_plan

            plan = read_plan(path)
            definition = StudyDefinition.from_dict(plan["definition"])
            options = comparison_options(args, plan.get("comparison"), f"{path / 'plan.json'}: comparison.baseline")
            rule = SeedRule.from_dict(plan.get("seeds_auto"))
            results = collect(path, definition, expand_cells(definition), options, rule)
            lost = [] if published else cells_lost(path, results)  # a copy's report is of what was copied
            if lost:
                more = f" and {len(lost) - 1} more" if len(lost) > 1 else ""
                raise UserError(
                    f"{path / 'study.json'} reports cells done whose files no longer say so ({lost[0]}{more}: "
                    f"{path / 'cells' / lost[0] / 'cell.json'}); restore them, or delete {path / 'study.json'} "
                    "to draw the report from the cells that are there."
                )
            files = [*write_results(path, results), *plot_study(path, results)]
            footer = [f"Study {path}: {progress_line(results)}."]
        elif (path / "metrics.jsonl").is_file():
            files, footer = plot_run(path), []
        else:
            raise UserError(f"{path} is neither a study folder (plan.json) nor a training run folder (metrics.jsonl).")
        print("\n".join([*published, *(f"Wrote {f}" for f in files), *footer]))
        return 0
