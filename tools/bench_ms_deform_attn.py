"""Micro-benchmark of the multi-scale deformable attention core.

Times every implementation of :func:`detr_peg.models.deformable.ms_deform_attn_function.ms_deform_attn`
plus the official ``ms_deform_attn_core_pytorch`` algorithm
(:mod:`detr_peg.models.deformable.ms_deform_attn_official`: per-level
``grid_sample``, stack, multiply, sum) at the shapes of
Deformable-DETR-R50 on an 800x1066 image: 4 levels of (100, 134), (50, 67),
(25, 34), (13, 17) = 17,821 tokens, 8 heads, head_dim 32, 4 points; the
encoder has one query per token, the decoder 300 queries.

Sampling locations are realistic: encoder queries sit at their token's pixel
center, decoder queries at random points, and offsets are a few pixels (as
after training), so that memory access has the locality of the real model.

Usage::

    python tools/bench_ms_deform_attn.py                 # CPU, 2 threads, batch 1
    python tools/bench_ms_deform_attn.py --device cuda --batch 1 2   # adds impl="triton"
    python tools/bench_ms_deform_attn.py --device cuda --official-op ../Deformable-DETR  # + its CUDA op
    python tools/bench_ms_deform_attn.py --impl embedding_bag official --repeats 9

Prints one row per (device, batch, shape, implementation): the median (or
minimum, ``--stat min``) time of
the forward pass (under ``torch.no_grad``) and of forward + backward (gradients
for value, sampling locations and attention weights), and the largest
difference of the forward output from the official algorithm.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from detr_peg.cli import option_types
from detr_peg.cli.main import OneLineParser
from detr_peg.engine.distributed import resolve_device
from detr_peg.errors import ConfigError
from detr_peg.lab.benchmark.measure import synchronize
from detr_peg.lab.benchmark.timing import time_runs
from detr_peg.models.deformable.ms_deform_attn_function import CUDA_IMPLEMENTATIONS, IMPLEMENTATIONS, ms_deform_attn
from detr_peg.models.deformable.ms_deform_attn_official import ms_deform_attn_core_pytorch

SPATIAL_SHAPES = [(100, 134), (50, 67), (25, 34), (13, 17)]
N_HEADS, HEAD_DIM, N_POINTS = 8, 32, 4
DECODER_QUERIES = 300
OFFICIAL_IM2COL_STEP = 64  # the official MSDeformAttn default


def make_inputs(batch: int, queries: str, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """Inputs at the Deformable-DETR-R50 800x1066 shapes; ``queries`` is "encoder" or "decoder"."""
    gen = torch.Generator().manual_seed(seed)
    shapes = torch.tensor(SPATIAL_SHAPES, dtype=torch.int64)
    areas = shapes[:, 0] * shapes[:, 1]
    start = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])
    s = int(areas.sum())
    n_levels = len(SPATIAL_SHAPES)
    if queries == "encoder":
        centers = []
        for h, w in SPATIAL_SHAPES:
            ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
            centers.append(torch.stack([xs.flatten() / w, ys.flatten() / h], -1))
        ref = torch.cat(centers)[None].expand(batch, s, 2)
    else:
        ref = torch.rand(batch, DECODER_QUERIES, 2, generator=gen)
    lq = ref.shape[1]
    offsets = torch.randn(batch, lq, N_HEADS, n_levels, N_POINTS, 2, generator=gen) * 2.0
    locations = ref[:, :, None, None, None, :] + offsets / shapes.flip(-1)[:, None, :]
    logits = torch.randn(batch, lq, N_HEADS, n_levels * N_POINTS, generator=gen)
    weights = logits.softmax(-1).view(batch, lq, N_HEADS, n_levels, N_POINTS)
    value = torch.randn(batch, s, N_HEADS, HEAD_DIM, generator=gen)
    to = dict(device=device, dtype=dtype)
    return value.to(**to), shapes.to(device), start.to(device), locations.to(**to), weights.to(**to)


def time_ms(fn: Callable[[], object], repeats: int, device: torch.device, stat: str = "median") -> float:
    """Milliseconds per call of ``fn`` after one warm-up call: the median or the minimum of ``repeats`` runs."""
    timing = time_runs(fn, warmup=1, runs=repeats, sync=lambda: synchronize(device))
    return (timing.median if stat == "median" else min(timing.runs)) * 1000.0


def main() -> None:
    parser = OneLineParser(prog="bench_ms_deform_attn.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", nargs="+", type=option_types.device, default=None,
                        help="devices to time (default: cpu, and cuda when available)")  # fmt: skip
    parser.add_argument(
        "--impl",
        nargs="+",
        default=["official", *IMPLEMENTATIONS, *CUDA_IMPLEMENTATIONS],
        choices=["official", *IMPLEMENTATIONS, *CUDA_IMPLEMENTATIONS],
        help=f"implementations to time ({', '.join(CUDA_IMPLEMENTATIONS)}: CUDA devices only)",
    )
    parser.add_argument("--batch", nargs="+", type=int, default=[1], help="batch sizes")
    parser.add_argument("--shape", nargs="+", default=["encoder", "decoder"], choices=["encoder", "decoder"])
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per measurement")
    parser.add_argument("--stat", default="median", choices=["median", "min"],
                        help="statistic of the timed runs (min is steadier on a busy machine)")  # fmt: skip
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--no-backward", action="store_true", help="time the forward pass only")
    parser.add_argument("--official-op", metavar="PATH",
                        help="checkout of fundamentalvision/Deformable-DETR: also time its compiled CUDA op (built "
                             "here, see detr_peg/models/deformable/official_cuda_op.py) "
                             "as impl official_cuda")  # fmt: skip
    args = parser.parse_args()
    for name in args.device or []:  # a GPU asked for on a machine without one: one line before the table
        try:
            resolve_device(name)
        except ConfigError as exc:
            parser.error(str(exc).replace("train.device=", "--device ").replace("train.device", "--device"))
    official_op = None
    if args.official_op:
        from detr_peg.models.deformable.official_cuda_op import build_official_op

        official_op = build_official_op(args.official_op)
        args.impl = [*args.impl, "official_cuda"]

    torch.set_num_threads(args.threads)
    devices = args.device or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {args.threads} CPU threads, {args.dtype}, {args.stat} of {args.repeats} runs")
    print(
        f"{'device':8s} {'batch':>5s} {'shape':8s} {'impl':14s} {'forward ms':>11s} {'fwd+bwd ms':>11s} "
        f"{'max |diff|':>10s}"
    )
    for device_name in devices:
        device = torch.device(device_name)
        for batch in args.batch:
            for shape in args.shape:
                value, shapes, start, locations, weights = make_inputs(batch, shape, device, dtype)
                with torch.no_grad():
                    reference = ms_deform_attn_core_pytorch(value, shapes, locations, weights)
                for impl in args.impl:
                    if (impl in CUDA_IMPLEMENTATIONS or impl == "official_cuda") and device.type != "cuda":
                        continue

                    def run(impl=impl):
                        if impl == "official":
                            return ms_deform_attn_core_pytorch(value, shapes, locations, weights)
                        if impl == "official_cuda":
                            return official_op.ms_deform_attn_forward(
                                value, shapes, start, locations, weights, OFFICIAL_IM2COL_STEP
                            )
                        return ms_deform_attn(value, shapes, start, locations, weights, impl=impl)

                    with torch.no_grad():
                        diff = (run() - reference).abs().max().item()
                        forward = time_ms(run, args.repeats, device, args.stat)
                    both = float("nan")
                    if not args.no_backward:
                        inputs = [t.detach().requires_grad_(True) for t in (value, locations, weights)]
                        grad = torch.randn_like(reference)

                        def run_backward(impl=impl, inputs=inputs, grad=grad):
                            v, loc, w = inputs
                            if impl == "official_cuda":
                                # What the official MSDeformAttnFunction runs: its forward, then its backward.
                                official_op.ms_deform_attn_forward(v, shapes, start, loc, w, OFFICIAL_IM2COL_STEP)
                                official_op.ms_deform_attn_backward(
                                    v, shapes, start, loc, w, grad, OFFICIAL_IM2COL_STEP
                                )
                                return
                            if impl == "official":
                                out = ms_deform_attn_core_pytorch(v, shapes, loc, w)
                            else:
                                out = ms_deform_attn(v, shapes, start, loc, w, impl=impl)
                            torch.autograd.grad(out, inputs, grad)

                        both = time_ms(run_backward, args.repeats, device, args.stat)
                    print(
                        f"{device_name:8s} {batch:5d} {shape:8s} {impl:14s} {forward:11.1f} {both:11.1f} {diff:10.2e}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
