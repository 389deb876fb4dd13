"""Run a grid of training runs (base configs x grid axes x seeds), evaluate each, and tabulate and plot the results.

Each cell is an ordinary training run in STUDY/cells/<name>/run (evaluated into
STUDY/cells/<name>/eval when test scales or padding are asked for). The study
folder gets plan.json, study.md / study.csv / study.json (mean +- std over seeds,
and paired comparisons of every setting with the reference setting --baseline,
seed by seed, with verdicts; --equal-within X AP) and plots/.

--seeds auto adds seeds in rounds until every comparison's 95% interval has a
half-width of at most --target-ci AP points, or --max-seeds is reached.
Grid values are parsed like key=value overrides (commas inside brackets belong
to the value). Rerunning the command resumes the study; a failed cell gives exit
status 3. --jobs N runs N cells at a time here; --slurm submits one job per cell.

Examples (the proxy configs train on the synthetic shapes: run detr-peg demo --data-only once):
  detr-peg study --study configs/study/proxy_synthetic.yaml --output studies/proxy_synthetic --jobs 2
  detr-peg study --config configs/proxy/detr_small.yaml --grid model.position.name=sine,learned,none,peg \\
      --seeds 3 --scales 1,1.5,2 --canvas-scales 1.5,2 --padding --output studies/detr_small
  detr-peg study --config configs/detr_r50_peg.yaml --grid model.position.peg_layers=[0],[0,1,2] \\
      --grid model.position.peg_kernel=1,3,7 --output studies/peg_placement --plan
  detr-peg study --config configs/proxy/detr_small.yaml --grid model.position.name=sine,peg \\
      --seeds auto --target-ci 1.0 --max-seeds 10 --output studies/sine_vs_peg
  detr-peg study --study configs/study/paper_coco.yaml --output studies/paper --slurm --slurm-partition gpu
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import time
import traceback
from pathlib import Path

from detr_peg.cli import option_types
from detr_peg.cli.main import main
from detr_peg.messages import listed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--output", required=True, metavar="STUDY_DIR", help="the study folder")
    parser.add_argument("--study", type=option_types.config_file, metavar="FILE",
                        help="study file or shipped study name (study/proxy_synthetic); options below "
                             "add to it")  # fmt: skip
    parser.add_argument("--config", action="append", type=option_types.config_file, default=[], metavar="FILE",
                        help="base config; repeat for several (they form an axis of the grid)")  # fmt: skip
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="a grid axis; repeat for several (their product is taken)")  # fmt: skip
    parser.add_argument("--seeds", metavar="N|auto",
                        help="seeds per setting: train.seed = 0 .. N-1 (default 1); auto: add seeds in rounds until "
                             "every comparison's 95%% interval is within --target-ci")  # fmt: skip
    parser.add_argument("--target-ci", metavar="AP",
                        help="with --seeds auto: the 95%% interval half-width to reach (default 1.0)")  # fmt: skip
    parser.add_argument("--max-seeds", type=option_types.integer(2), metavar="N",
                        help="with --seeds auto: at most N seeds (default 10)")  # fmt: skip
    add_comparison_arguments(parser)
    ev = parser.add_argument_group("evaluation (passed to detr-peg eval)")
    ev.add_argument("--scales", type=option_types.scale_list, metavar="S1,S2",
                    help="test scales: the validation images resized, e.g. 1,1.5,2")  # fmt: skip
    ev.add_argument("--canvas-scales", type=option_types.scale_list, metavar="S1,S2",
                    help="test scales: a larger synthetic canvas with objects of the training "
                         "size, e.g. 1.5,2")  # fmt: skip
    ev.add_argument("--padding", action="store_true", default=None,
                    help="compare mixed-size evaluation batches with one image at a time")  # fmt: skip
    add_run_arguments(parser)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every cell")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the cells run: here (``--jobs``), on SLURM or as local submitit jobs, and the jobs' resources."""
    run = parser.add_argument_group("where the cells run")
    run.add_argument("--plan", action="store_true", help="print every cell's commands and exit")
    run.add_argument("--jobs", type=option_types.integer(1), metavar="N",
                     help="run N cells at a time on this machine, each in its own process with 1/N of the CPU cores as "
                          "torch threads (default 1: one after the other in this process)")  # fmt: skip
    run.add_argument("--slurm", action="store_true", help="one SLURM job per cell through submitit")
    run.add_argument("--submitit-local", action="store_true",
                     help="the same jobs as local processes (submitit's LocalExecutor), no SLURM")  # fmt: skip
    run.add_argument("--no-wait", action="store_true",
                     help="with --slurm: return after submitting (detr-peg plot STUDY writes "
                          "the tables later)")  # fmt: skip
    run.add_argument("--slurm-partition", metavar="NAME", help="SLURM partition")
    run.add_argument("--nodes", type=option_types.integer(1), metavar="N", help="machines per cell (default 1)")
    run.add_argument("--gpus-per-node", type=option_types.integer(1), metavar="N",
                     help="GPUs (training processes) per machine (default 8)")  # fmt: skip
    run.add_argument("--time", metavar="HH:MM:SS", help="time limit per cell (default 72:00:00)")
    run.add_argument("--cpus-per-task", type=option_types.integer(1), metavar="N",
                     help="CPU cores per process (default 10)")  # fmt: skip
    run.add_argument("--mem", metavar="SIZE", help="memory per machine, e.g. 256G")


def add_comparison_arguments(parser: argparse.ArgumentParser, *, recorded: bool = False) -> None:
    """``--baseline`` and ``--equal-within`` (``study`` and ``plot``; ``recorded``: the defaults the study ran with)."""
    group = parser.add_argument_group("paired comparisons in the report")
    group.add_argument(
        "--baseline",
        metavar="KEY=VALUE",
        help="the reference setting's value of one axis (config=FILE for the base configs); default: "
        + ("the study's own" if recorded else "the first value of the first axis that has several"),
    )
    group.add_argument(
        "--equal-within",
        metavar="AP",
        help="call a comparison equal when its whole 95%% interval lies within +-AP points (default: "
        + ("the study's own" if recorded else "1.0")
        + ")",
    )


def comparison_options(args: argparse.Namespace, earlier: dict | None, source: str):
    """The report's comparison options: the command's, else ``earlier`` (``source`` names where, for messages)."""
    from detr_peg.lab.study.comparisons import ComparisonOptions, parse_equal_within

    earlier = ComparisonOptions.from_dict(earlier)
    given = args.baseline is not None
    return ComparisonOptions(
        baseline=args.baseline if given else earlier.baseline,
        equal_within=parse_equal_within(args.equal_within) if args.equal_within is not None else earlier.equal_within,
        baseline_source="--baseline" if given else source,
    )


def seed_rule(args: argparse.Namespace, file):
    """The ``--seeds auto`` rule of the command (options, then the study file), or None for a fixed count."""
    from detr_peg.errors import ConfigError
    from detr_peg.lab.study.comparisons import parse_equal_within
    from detr_peg.lab.study.seed_rule import SeedRule

    auto = args.seeds == "auto" if args.seeds is not None else file.seeds == "auto"
    if not auto:
        if args.target_ci is not None or args.max_seeds is not None:
            raise ConfigError("--target-ci and --max-seeds go with --seeds auto.")
        return None
    target = parse_equal_within(args.target_ci, "--target-ci") if args.target_ci is not None else file.target_ci
    return SeedRule(target_ci=target or 1.0, max_seeds=args.max_seeds or file.max_seeds or 10)


def definition_from_args(args: argparse.Namespace):
    """The study definition, cluster and comparison options and seed rule; options override the study file."""
    from detr_peg.config.loader import check_config_file
    from detr_peg.config.shipped import resolve_config
    from detr_peg.errors import ConfigError
    from detr_peg.lab.study.study_file import StudyFile, load_study_file

    # The files are checked before torch (through the cluster options' module) and scipy are imported.
    file = load_study_file(args.study) if args.study else StudyFile()
    configs = [*file.configs, *(str(resolve_config(c).resolve()) for c in args.config)]
    if not configs:
        raise ConfigError("A study needs a base config: --config FILE (or 'configs' in a --study file).")
    for config in configs:
        check_config_file(config)

    from detr_peg.lab.study.comparisons import reference
    from detr_peg.lab.study.grid import (
        EvalPlan,
        StudyDefinition,
        check_distinct_axes,
        parse_axis,
        parse_seeds,
    )
    from detr_peg.lab.study.slurm import ClusterOptions

    given = [parse_axis(text) for text in args.grid]
    check_distinct_axes(given)
    axes = {axis.key: axis for axis in (parse_axis(text, f"{args.study}: grid") for text in file.grid)}
    axes.update({axis.key: axis for axis in given})  # the command line wins over the study file
    rule = seed_rule(args, file)
    if rule is not None:
        seeds = rule.start(0)
    else:
        seeds = parse_seeds(args.seeds) if args.seeds is not None else (file.seeds or 1)
    ev = file.eval
    scales = tuple(args.scales or (float(s) for s in ev.get("scales", ())))
    canvas = tuple(args.canvas_scales or (float(s) for s in ev.get("canvas_scales", ())))
    padding = bool(ev.get("padding", False)) if args.padding is None else args.padding
    definition = StudyDefinition(
        configs=tuple(configs),
        axes=tuple(axes.values()),
        seeds=seeds,
        overrides=(*file.overrides, *args.overrides),
        eval=EvalPlan(scales=scales, canvas_scales=canvas, padding=padding),
        override_sources=tuple((item.partition("=")[0].strip(), f"{args.study}: overrides") for item in file.overrides),
    )
    cl = file.cluster
    cluster = ClusterOptions(
        partition=args.slurm_partition or cl.get("partition"),
        nodes=args.nodes or cl.get("nodes", 1),
        gpus_per_node=args.gpus_per_node or cl.get("gpus_per_node", 8),
        time=args.time or str(cl.get("time", "72:00:00")),
        cpus_per_task=args.cpus_per_task or cl.get("cpus_per_task", 10),
        mem=args.mem or cl.get("mem"),
        local=args.submitit_local,
    )
    options = comparison_options(args, file.comparison, f"{args.study}: baseline")
    # A wrong baseline is refused before any run.
    compared = reference(definition.to_dict(), options.baseline, options.baseline_source)
    if rule is not None and compared is None:
        given = "--seeds auto" if args.seeds is not None else f"{args.study}: seeds: auto"
        raise ConfigError(f"{given} needs two settings or more to compare (a --grid axis or several --config).")
    return definition, cluster, options, rule


def run_command(argv: list[str], log: Path) -> tuple[int, str | None]:
    """Run ``detr-peg ARGV`` here, output appended to ``log``; the exit status and, when not 0, the one-line error."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ detr-peg {' '.join(argv)}\n")
        out.flush()
        offset = out.tell()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                code = int(main(argv) or 0)
        except Exception as exc:  # noqa: BLE001  (a bug: keep the traceback in the log, one line for the table)
            traceback.print_exc(file=out)
            return 1, f"{type(exc).__name__}: {exc} (traceback in {log})"
    if code == 0:
        return 0, None
    with open(log, encoding="utf-8") as text:
        text.seek(offset)
        lines = [line.strip() for line in text if line.startswith(f"detr-peg {argv[0]}")]
    return code, lines[-1] if lines else f"detr-peg {argv[0]} exited with status {code} (see {log})"


class _NotWaiting(Exception):
    """``--no-wait``: the jobs were submitted and the command returns (a rerun continues the study)."""


def run_cells(args: argparse.Namespace, study_dir: Path, cluster, definition, cells, *, auto: bool) -> list:
    """Run the cells not done yet, here or as jobs; their outcomes (``_NotWaiting`` after ``--no-wait`` submits)."""
    from detr_peg.lab.study import runner, slurm
    from detr_peg.lab.study.grid import run_order

    todo = [cell for cell in cells if not runner.is_done(study_dir, cell)]
    print(f"study: {len(cells)} cells in {study_dir} ({len(cells) - len(todo)} already done)", flush=True)
    if not todo:
        return []
    if not (args.slurm or args.submitit_local):
        return runner.run_here(study_dir, definition, cells, run_command, jobs=args.jobs or 1)
    if definition.eval.canvas_scales:
        runner.make_canvas_sets(todo, definition.eval.canvas_scales)
    todo = run_order(todo)  # submitted seed by seed, as they run here
    submitted = slurm.submit(study_dir, todo, definition.eval, cluster, run_command)
    print(
        f"study: submitted {len(submitted)} jobs ({listed(j.job_id for j in submitted)}); "
        f"logs in {study_dir / slurm.JOBS_DIR}",
        flush=True,
    )
    if args.no_wait:
        more = " and plans the next round of seeds" if auto else ""
        print(
            f"study: not waiting; detr-peg plot {study_dir} writes the tables of the cells done so far; "
            f"the same command, run once the jobs have ended, continues the study{more}."
        )
        raise _NotWaiting
    return slurm.wait(
        study_dir, submitted, todo, len(cells), len(cells) - len(todo), poll_seconds=1 if cluster.local else 10
    )


def run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as claims:  # the output folders' claims, settled on leaving
        from dataclasses import replace

        from detr_peg.errors import ConfigError

        started = time.monotonic()
        notes, seen = logging.getLogger("detr_peg.config.loader"), set()

        def once(record: logging.LogRecord) -> bool:  # a cell's config is read several times: each note once
            new = record.getMessage() not in seen
            seen.add(record.getMessage())
            return new

        notes.addFilter(once)
        claims.callback(notes.removeFilter, once)
        if args.slurm and args.submitit_local:
            raise ConfigError("--slurm and --submitit-local exclude each other; choose one.")
        if args.jobs and (args.slurm or args.submitit_local):
            raise ConfigError("--jobs runs cells on this machine; with --slurm or --submitit-local each cell is a job.")
        jobs = args.slurm or args.submitit_local
        definition, cluster, options, rule = definition_from_args(args)

        from detr_peg.lab.study import runner, slurm
        from detr_peg.lab.study.comparisons import format_points
        from detr_peg.lab.study.grid import StudyDefinition, expand_cells
        from detr_peg.lab.study.plots import plot_study
        from detr_peg.lab.study.results import collect, write_results
        from detr_peg.lab.study.stored_files import read_plan

        if jobs:  # the sizes were checked where they were read (option types, the study file's rule table)
            slurm.parse_time(cluster.time)
            if not args.plan:  # before the study folder is written
                slurm.require_submitit()
        study_dir = Path(args.output)
        if rule is not None:  # a rerun continues with the seeds the folder already planned
            earlier = read_plan(study_dir)
            definition = replace(definition, seeds=rule.start(int(earlier["definition"]["seeds"]) if earlier else 0))
        # Inputs every cell would fail on are refused before anything is written.
        runner.check_test_scales(expand_cells(definition), definition.eval)
        if not (args.plan or args.slurm):  # cluster jobs may see other file systems than this machine
            runner.check_data_paths([c for c in expand_cells(definition) if not runner.is_done(study_dir, c)])
        if not args.plan:
            from detr_peg.lab.study.stored_files import study_io
            from detr_peg.outputs import guard_outputs

            claims.enter_context(guard_outputs("study", *study_io(study_dir, definition.configs, args.study)))
        report = {"comparison": options.to_dict(), "seeds_auto": rule.to_dict() if rule else None}
        cells = runner.prepare(study_dir, definition, write=not args.plan, report=report)
        if args.plan:
            print("\n".join(slurm.plan_lines(study_dir, cells, definition.eval, cluster if jobs else None)))
            if rule is not None:
                print(
                    f"# --seeds auto: the first round ({definition.seeds} seeds per setting); more rounds may follow, "
                    f"up to {rule.max_seeds} seeds per setting, until every comparison's 95% interval is within "
                    f"±{format_points(rule.target_ci)} AP"
                )
            return 0

        run_round = functools.partial(run_cells, args, study_dir, cluster, auto=rule is not None)
        try:
            if rule is None:
                run_round(definition, cells)
            else:
                runner.run_in_rounds(study_dir, definition, rule, options, run_round, report)
        except _NotWaiting:
            return 0
        finally:
            if rule is not None:  # the last round planned (plan.json), also when a round was interrupted
                definition = StudyDefinition.from_dict(read_plan(study_dir)["definition"])
                cells = expand_cells(definition)
            results = collect(study_dir, definition, cells, options, rule)
            write_results(study_dir, results)
            plot_study(study_dir, results)
        line, status = runner.summary_line(study_dir, cells, started)
        print(line)
        return status
