"""Measure inference latency, training-step time, peak memory and FLOPs.

Each case runs in a fresh process on random inputs and weights, timed as the median
over --runs after --warmup runs (--rounds N interleaves N passes over the cases).
--compare sets values of one config key side by side, --official adds the official
code (a local checkout), --onnx adds ONNX Runtime on the CPU; --gpu measures
images/s under bf16 and torch.compile. % peak is achieved FLOP/s over the
machine's matmul peak, measured first.

Examples:
  detr-peg bench --config configs/detr_r50_sine.yaml --compare model.position.name=sine,peg
  detr-peg bench --config configs/detr_r50_sine.yaml --official ../detr --train-size 512x512
  detr-peg bench --config configs/deformable_detr_r50_peg.yaml --device cuda --amp bf16
  detr-peg bench --config configs/detr_r50_peg.yaml --modes infer --onnx
  detr-peg bench --config configs/deformable_detr_r50_sine.yaml --gpu --official ../Deformable-DETR --batch 4
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

from detr_peg.cli import option_types

if TYPE_CHECKING:
    from detr_peg.lab.benchmark.matmul_peak import MatmulPeak

#: Errors about these config keys name the option instead, when it was given.
OPTION_KEYS = {"--device": "train.device", "--amp": "train.amp"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--config", type=option_types.config_file, metavar="FILE",
                        help="config file or shipped config name (detr-peg configs list) to benchmark")  # fmt: skip
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    parser.add_argument("--modes", default="infer,train", help="comma-separated: infer, train (default both)")
    parser.add_argument("--infer-size", type=option_types.image_size, default="800x1066",
                        help="HxW of inference inputs (default 800x1066)")  # fmt: skip
    parser.add_argument("--train-size", type=option_types.image_size, default="512x512",
                        help="HxW of training inputs (default 512x512)")  # fmt: skip
    parser.add_argument("--batch", type=option_types.integer(1), default=1, help="images per batch (default 1)")
    parser.add_argument("--device", type=option_types.device, default="cpu",
                        help="auto, cpu, cuda or cuda:N (default cpu; auto: cuda when there is one)")  # fmt: skip
    parser.add_argument("--threads", type=option_types.integer(1, 1024), default=2, help="CPU threads (default 2)")
    parser.add_argument("--warmup", type=option_types.integer(0), default=3,
                        help="untimed runs (default 3: a process's first training steps still grow its memory, with "
                             "page faults that later steps do not have)")  # fmt: skip
    parser.add_argument("--runs", type=option_types.integer(1), default=5, help="timed runs (default 5)")
    parser.add_argument("--rounds", type=option_types.integer(1), default=1,
                        help="run the list of cases this many times, pooling each case's runs (default 1)")  # fmt: skip
    parser.add_argument("--amp", choices=["none", "auto", "bf16", "fp16"], default="none",
                        help="autocast dtype for every case: bf16 on a GPU or on a CPU with AMX or AVX512-BF16, fp16 on "
                             "a GPU, auto: bf16 where native; the matmul peak is then measured in that dtype (default: "
                             "none: each config's train.amp; the override train.amp=none measures float32)")  # fmt: skip
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--no-flops", action="store_true", help="skip FLOP counting")
    parser.add_argument("--peak-size", type=option_types.integer(0, 16384), default=4096, metavar="N",
                        help="measure the fp32 matmul peak with N x N torch.mm before the cases and give each row's "
                             "FLOP/s as a fraction of it (default 4096; 0 skips it)")  # fmt: skip
    parser.add_argument("--gpu", action="store_true",
                        help="GPU mode: --device cuda --amp bf16 --compile, images/s, one row per deformable-attention "
                             "implementation, the official code with its CUDA op")  # fmt: skip
    parser.add_argument("--compare", type=option_types.key_values, metavar="KEY=V1,V2",
                        help="one row per value of a config key")  # fmt: skip
    parser.add_argument("--official", metavar="PATH", help="checkout of the official repository to compare with")
    parser.add_argument("--official-args", default="", help="extra flags for the official model (quoted)")
    parser.add_argument("--onnx", action="store_true",
                        help="add an ONNX Runtime (CPU) case after every inference "
                             "case (needs detr_peg[onnx])")  # fmt: skip
    parser.add_argument("--output", metavar="FILE", default="bench.json", help="JSON report (default bench.json)")


def _measure_peak(args: argparse.Namespace, amp: str, device: str) -> MatmulPeak:
    """The matmul peak of ``device`` and ``--threads`` in the dtype of ``amp`` (float32 for ``none``)."""
    import torch

    from detr_peg.engine.mixed_precision import AMP_DTYPES
    from detr_peg.lab.benchmark.matmul_peak import measure_matmul_peak

    return measure_matmul_peak(device, args.threads, size=args.peak_size, dtype=AMP_DTYPES.get(amp, torch.float32))


def run(args: argparse.Namespace) -> int:
    from detr_peg.config import load_config
    from detr_peg.outputs import Output, guard_outputs, inputs

    with contextlib.ExitStack() as claims:  # the output folders' claims, settled on leaving
        _check_gpu(args)
        cfg = load_config(args.config, args.overrides)  # validates the config before any work
        claims.enter_context(
            guard_outputs("bench", inputs((args.config, "--config")), [Output(args.output, "--output")])
        )
        modes = _check_options(args, cfg)
        _report(args, _run_with_peaks(args, _plan(args, cfg, modes)))
        return 0


def _check_gpu(args: argparse.Namespace) -> None:
    from detr_peg.errors import ConfigError

    if args.gpu:
        from detr_peg.lab.benchmark.gpu import require_cuda

        require_cuda()
        if args.compare:
            raise ConfigError(
                "--gpu compares the attention implementations and the official code; run --compare without --gpu."
            )


def _check_options(args: argparse.Namespace, cfg) -> list[str]:
    """The modes asked for; refuses options this machine or the config cannot run, before any case."""
    import torch

    from detr_peg.engine.distributed import resolve_device
    from detr_peg.engine.mixed_precision import check_amp, resolve_amp
    from detr_peg.errors import ConfigError

    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in ("infer", "train")]
    if bad or not modes:
        raise ConfigError(f"--modes {args.modes!r}: valid modes are infer, train.")
    args.device = str(resolve_device(args.device))  # auto -> cuda or cpu; refuses CUDA where there is none
    check_amp(args.amp, torch.device(args.device))
    args.amp = resolve_amp(args.amp, torch.device(args.device))  # the dtype measured, named in the table
    if args.onnx:
        from detr_peg.export.export_options import require_onnx

        require_onnx()
        if args.device != "cpu" or "infer" not in modes:
            raise ConfigError("--onnx measures ONNX Runtime on the CPU: use it with --device cpu and the infer mode.")
    if args.official:
        from detr_peg.lab.benchmark.official import check_official_repo

        check_official_repo(args.official, cfg.model.arch)
    return modes


def _plan(args: argparse.Namespace, cfg, modes: list[str]) -> list:
    """The cases to measure; each config's ``train.amp`` is checked on this device first."""
    import torch

    from detr_peg.config import load_config
    from detr_peg.engine.mixed_precision import check_amp
    from detr_peg.lab.benchmark.runner import plan_cases
    from detr_peg.lab.benchmark.worker import Case

    base = Case(
        label="detr_peg", impl="detr_peg", mode=modes[0], arch=cfg.model.arch, config=args.config,
        overrides=list(args.overrides), batch=args.batch, device=args.device, threads=args.threads,
        warmup=args.warmup, runs=args.runs, amp=args.amp, compile=args.compile, flops=not args.no_flops,
    )  # fmt: skip
    sizes = {"infer": args.infer_size, "train": args.train_size}
    official = {"official_repo": args.official, "official_args": args.official_args.split()}
    if args.gpu:
        from detr_peg.lab.benchmark.gpu import plan_gpu_cases

        cases = plan_gpu_cases(base, modes=modes, sizes=sizes, **official)
    else:
        cases = plan_cases(base, modes=modes, sizes=sizes, compare=args.compare, onnx=args.onnx, **official)
    # A case without --amp runs in its config's train.amp, which must run on this device.
    for case in cases:
        if case.config is not None and case.amp == "none":
            check_amp(load_config(case.config, case.overrides).train.amp, torch.device(args.device))
    return cases


def _run_with_peaks(args: argparse.Namespace, cases: list) -> tuple[list[dict], dict]:
    """Measure the matmul peak (``--peak-size``), then the cases; the rows and the peaks."""
    from detr_peg.lab.benchmark.matmul_peak import add_peak_fractions
    from detr_peg.lab.benchmark.report import add_ratios
    from detr_peg.lab.benchmark.runner import run_cases

    peaks: dict[str, MatmulPeak] = {}
    device = cases[0].device  # every case runs on one device (--gpu: CUDA, whatever --device says)
    amp = cases[0].amp
    if args.peak_size:  # before the cases, in the dtype the cases compute in
        peaks[amp] = _measure_peak(args, amp, device)
    results = add_ratios(run_cases(cases, progress=sys.stderr.isatty(), rounds=args.rounds))
    if peaks:
        # Rows that computed in another dtype (--compare train.amp=none,auto) are compared with its own peak.
        for amp in sorted({r.get("amp", "none") for r in results} - set(peaks)):
            peaks[amp] = _measure_peak(args, amp, device)
        add_peak_fractions(results, peaks)
    return results, peaks


def _report(args: argparse.Namespace, measured: tuple[list[dict], dict]) -> None:
    from detr_peg.lab.benchmark.report import format_table, write_json

    results, peaks = measured
    print(format_table(results, "\n".join(p.describe() for p in peaks.values()) or None))
    if args.gpu:
        from detr_peg.lab.benchmark.gpu import add_throughput, format_throughput

        print("\n" + format_throughput(add_throughput(results)))
    first = next(iter(peaks.values()), None)
    write_json(
        results,
        args.output,
        matmul_peak=first.to_dict() if first else None,
        matmul_peaks={amp: p.to_dict() for amp, p in peaks.items()} if len(peaks) > 1 else None,
    )
    print(f"\nwrote {args.output}")
