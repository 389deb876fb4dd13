"""Measure inference latency, training-step time, peak memory and FLOPs.

Each case runs in a fresh process, one after another: inference (eval mode,
no gradients) and a full training step (forward, loss, backward, gradient
clipping, AdamW step) on random inputs with random weights, timed as the
median over --runs after --warmup runs; --rounds N runs the whole list N
times and pools each case's runs, so that a slow spell of a shared machine
falls on every case alike. Compare values of one config key side
by side with --compare, and the official implementation (a local checkout)
with --official; the last column is the speed relative to the first row of
each mode.

Examples:
  detr-peg bench --config configs/detr_r50_sine.yaml --compare model.position.name=sine,peg
  detr-peg bench --config configs/detr_r50_sine.yaml --official ../detr --train-size 512x512
  detr-peg bench --config configs/deformable_detr_r50_peg.yaml --device cuda --amp bf16
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--config", metavar="FILE", help="detr_peg config to benchmark")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    parser.add_argument("--modes", default="infer,train", help="comma-separated: infer, train (default both)")
    parser.add_argument("--infer-size", default="800x1066", help="HxW of inference inputs (default 800x1066)")
    parser.add_argument("--train-size", default="512x512", help="HxW of training inputs (default 512x512)")
    parser.add_argument("--batch", type=int, default=1, help="images per batch (default 1)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs (default 1)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs (default 5)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the list of cases this many times, pooling each case's runs (default 1)")
    parser.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none", help="autocast dtype (GPU)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--no-flops", action="store_true", help="skip FLOP counting")
    parser.add_argument("--compare", metavar="KEY=V1,V2", help="one row per value of a config key")
    parser.add_argument("--official", metavar="PATH", help="checkout of the official repository to compare with")
    parser.add_argument("--official-args", default="", help="extra flags for the official model (quoted)")
    parser.add_argument("--output", metavar="FILE", default="bench.json", help="JSON report (default bench.json)")


def run(args: argparse.Namespace) -> int:
    from detr_peg.benchmark.report import add_ratios, format_table, write_json
    from detr_peg.benchmark.runner import parse_compare, parse_size, plan_cases, run_cases
    from detr_peg.benchmark.worker import Case
    from detr_peg.config import load_config
    from detr_peg.errors import ConfigError

    cfg = load_config(args.config, args.overrides)  # validates the config before any work
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in ("infer", "train")]
    if bad or not modes:
        raise ConfigError(f"--modes {args.modes!r}: valid modes are infer, train.")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda was requested but no CUDA device is available.")
    if args.official:
        from detr_peg.benchmark.official import check_official_repo

        check_official_repo(args.official, cfg.model.arch)
    base = Case(label="detr_peg", impl="detr_peg", mode=modes[0], arch=cfg.model.arch, config=args.config,
                overrides=list(args.overrides), batch=args.batch, device=args.device, threads=args.threads,
                warmup=args.warmup, runs=args.runs, amp=args.amp, compile=args.compile, flops=not args.no_flops)
    cases = plan_cases(base, modes=modes,
                       sizes={"infer": parse_size(args.infer_size), "train": parse_size(args.train_size)},
                       compare=parse_compare(args.compare), official_repo=args.official,
                       official_args=args.official_args.split())
    results = add_ratios(run_cases(cases, progress=sys.stderr.isatty(), rounds=args.rounds))
    print(format_table(results))
    write_json(results, args.output)
    print(f"\nwrote {args.output}")
    return 0
