"""One benchmark case in its own process: ``python -m detr_peg.lab.benchmark.worker CASE_JSON``.

Prints ``BENCH_RESULT`` and JSON; with ``--export PATH`` it exports the case's model and prints
``BENCH_PARAMETERS`` instead. A process per case keeps peak memory separate and the official code apart.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from detr_peg.engine.memory_allocator import retain_freed_memory
from detr_peg.engine.mixed_precision import autocast as amp_autocast
from detr_peg.lab.benchmark.protocol import EXPORT_FLAG, PARAMETERS_PREFIX, RESULT_PREFIX
from detr_peg.lab.benchmark.timing import cpu_name, time_runs
from detr_peg.models.registry import attention_impl, set_attention_impl


@dataclass
class Case:
    """What to measure: one row of the report.

    ``impl``: ``detr_peg``, ``official`` or ``onnxruntime``; ``mode``: ``infer`` (eval, no grad) or ``train``
    (forward, loss, backward, clipping, AdamW step); ``overrides``: ``key=value`` or official CLI flags;
    ``attention_impl``: the deformable attention ``impl`` (None: as built); ``onnx_model``: where an ONNX
    case keeps its graph across rounds (None: a temporary file).
    """

    label: str
    impl: str
    mode: str
    arch: str = "detr"
    config: str | None = None
    overrides: list[str] = field(default_factory=list)
    official_repo: str | None = None
    height: int = 800
    width: int = 1066
    batch: int = 1
    device: str = "cpu"
    threads: int = 2
    warmup: int = 1
    runs: int = 5
    amp: str = "none"
    compile: bool = False
    flops: bool = True
    attention_impl: str | None = None
    onnx_model: str | None = None


def _targets(batch: int, num_classes: int, device: torch.device) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(batch):
        centers = torch.rand(3, 2, generator=g) * 0.6 + 0.2
        sizes = torch.rand(3, 2, generator=g) * 0.3 + 0.05
        labels = torch.randint(1, num_classes, (3,), generator=g)
        out.append({"labels": labels.to(device), "boxes": torch.cat([centers, sizes], 1).to(device)})
    return out


@dataclass
class Built:
    """A model ready to measure, with what its training step needs."""

    model: nn.Module
    criterion: nn.Module
    #: Builds the implementation's own training optimizer (detr_peg: the
    #: engine's fused AdamW; official: ``torch.optim.AdamW`` as its main.py).
    make_optimizer: Callable[[], torch.optim.Optimizer]
    weighted_total: Callable
    forward: Callable
    num_classes: int
    clip_max_norm: float
    #: The autocast of the config's ``train.amp`` on this device (detr_peg), used when the case sets none.
    config_amp: str = "none"
    #: The config's ``train.compile`` (detr_peg): compile even without ``--compile``.
    config_compile: bool = False


def _build(case: Case, device: torch.device) -> Built:
    if case.impl == "official":
        from detr_peg.lab.benchmark import official

        model, criterion, args = official.build_official(
            case.arch, case.official_repo, case.overrides, cuda_op=device.type == "cuda"
        )
        model.to(device)
        criterion.to(device)

        def forward(images, mask):
            return model(official.official_inputs(images, mask))

        def total(losses):
            return sum(losses[k] * criterion.weight_dict[k] for k in losses if k in criterion.weight_dict)

        def make_optimizer():
            groups = official.official_param_groups(model, args)
            return torch.optim.AdamW(groups, lr=args.lr, weight_decay=args.weight_decay)

        return Built(model, criterion, make_optimizer, total, forward, 91, args.clip_max_norm)

    from detr_peg.config import load_config
    from detr_peg.engine.mixed_precision import resolve_amp
    from detr_peg.engine.optimizer import build_optimizer
    from detr_peg.models import build_criterion, build_model

    overrides = ["model.backbone.weights=null", *case.overrides]
    cfg = load_config(case.config, overrides)  # its train.amp, if used, was checked before the cases
    if cfg.model.num_classes is None:
        cfg = load_config(case.config, ["model.num_classes=91", *overrides])
    model = build_model(cfg).to(device)
    criterion = build_criterion(cfg).to(device)
    if case.attention_impl is not None:
        set_attention_impl(model, case.attention_impl)
    return Built(
        model,
        criterion,
        lambda: build_optimizer(model, cfg.train),
        criterion.weighted_total,
        model,
        cfg.model.num_classes,
        cfg.train.clip_max_norm,
        resolve_amp(cfg.train.amp, device),
        cfg.train.compile,
    )


def dense_attention(model: nn.Module) -> contextlib.AbstractContextManager:
    """Count FLOPs with deformable attention on ``grid_sample`` (``embedding_bag``'s sparse backward counts dense)."""
    return attention_impl(model, lambda kind: kind.flop_count)


def run_case(case: Case) -> dict:
    """Measure one case; returns a JSON-ready dict."""
    from detr_peg.lab.benchmark.measure import count_flops, peak_memory_bytes, reset_peak_memory, synchronize

    torch.set_num_threads(case.threads)
    device = torch.device(case.device)
    torch.manual_seed(0)
    built = _build(case, device)
    model, criterion, forward = built.model, built.criterion, built.forward
    # --compile, or the config's train.compile (so that --compare train.compile=false,true compares them).
    compile_model = case.compile or built.config_compile
    if compile_model:
        forward = torch.compile(forward)
    images = torch.randn(case.batch, 3, case.height, case.width, device=device)
    mask = torch.zeros(case.batch, case.height, case.width, dtype=torch.bool, device=device)
    # --amp, else the config's train.amp (so that --compare train.amp=none,auto compares them).
    amp = case.amp if case.amp != "none" else built.config_amp

    def autocast():
        return amp_autocast(amp, device)

    if case.mode == "infer":
        model.eval()

        def step() -> None:
            with torch.no_grad(), autocast():
                forward(images, mask)
    else:
        model.train()
        targets = _targets(case.batch, built.num_classes, device)
        optimizer = built.make_optimizer()
        scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")

        def step() -> None:
            with autocast():
                outputs = forward(images, mask)
                loss = built.weighted_total(criterion(outputs, targets))
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            if built.clip_max_norm > 0:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), built.clip_max_norm)
            scaler.step(optimizer)
            scaler.update()

    reset_peak_memory(device)
    timing = time_runs(step, warmup=case.warmup, runs=case.runs, sync=lambda: synchronize(device))
    peak = peak_memory_bytes(device)
    flops = None
    if case.flops and not compile_model:
        # Inference FLOPs are counted with autograd on: torch's module tracker
        # cannot follow parameters passed as inputs under no_grad. Same FLOPs.
        with dense_attention(model):
            flops = count_flops(step if case.mode == "train" else lambda: forward(images, mask))
    result = asdict(case)
    result.update(
        amp=amp,
        compile=compile_model,
        seconds=timing.median,
        runs_seconds=timing.runs,
        peak_memory_bytes=peak,
        flops=flops,
        achieved_flops_per_s=(flops / timing.median) if flops else None,
        parameters=sum(p.numel() for p in model.parameters()),
        torch_version=torch.__version__,
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
    )
    return result


def export_case_model(case: Case, path: Path) -> int:
    """Build ``case``'s model as :func:`run_case` does (same seed), export it to ``path``; its parameter count."""
    from detr_peg.export.onnx_export import export_onnx

    torch.set_num_threads(case.threads)
    torch.manual_seed(0)
    model = _build(case, torch.device("cpu")).model.eval()
    export_onnx(model, path)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    """``CASE_JSON``: measure the case; ``CASE_JSON --export PATH``: export its model (for the ONNX case)."""
    argv = sys.argv[1:] if argv is None else argv
    case = Case(**json.loads(argv[0]))
    if argv[1:2] == [EXPORT_FLAG]:
        print(PARAMETERS_PREFIX + str(export_case_model(case, Path(argv[2]))), flush=True)
        return 0
    # As in the detr-peg command, for every case alike (the official code's included).
    retain_freed_memory()
    print(RESULT_PREFIX + json.dumps(run_case(case)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
