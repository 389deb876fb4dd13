"""AdamW over the parameter groups, the warm-up and StepLR schedule, and mixed precision on the CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from detr_peg.config import load_config
from detr_peg.engine.mixed_precision import (
    autocast,
    build_grad_scaler,
    check_amp,
    evaluation_amp,
    native_bf16,
    outputs_to_float,
    resolve_amp,
)
from detr_peg.engine.optimizer import build_lr_scheduler, build_optimizer, current_lrs
from detr_peg.errors import ConfigError


class _Named(nn.Module):
    """Parameters named like a detector's: backbone, transformer, deformable offsets, a frozen one."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(2, 2)
        self.transformer = nn.ModuleDict({"sampling_offsets": nn.Linear(2, 2), "ffn": nn.Linear(2, 2)})
        self.frozen = nn.Linear(2, 2)
        self.frozen.requires_grad_(False)


def _recipe(*extra: str):
    return load_config("configs/detr_r50_peg.yaml", list(extra)).train


def test_optimizer_follows_the_paper_recipe() -> None:
    train = _recipe()
    opt = build_optimizer(_Named(), train)
    assert isinstance(opt, torch.optim.AdamW)
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"transformer", "backbone", "linear_proj"}
    assert groups["transformer"]["lr"] == 1e-4 and groups["backbone"]["lr"] == 2e-5
    assert groups["linear_proj"]["lr"] == pytest.approx(1e-5)
    assert all(g["weight_decay"] == 1e-4 for g in opt.param_groups)
    assert sum(len(g["params"]) for g in opt.param_groups) == 6  # the frozen layer is left out
    assert current_lrs(opt) == {"lr_transformer": 1e-4, "lr_backbone": 2e-5, "lr_linear_proj": pytest.approx(1e-5)}


def test_fused_adamw_on_the_cpu_follows_the_reference_update() -> None:
    """The fused kernel does what the reference (for-loop) AdamW does, up to float rounding, over several steps."""
    torch.manual_seed(0)
    model = _Named()
    reference = _Named()
    reference.load_state_dict(model.state_dict())
    train = _recipe()
    fused = build_optimizer(model, train)
    assert all(g["fused"] for g in fused.param_groups)
    params = dict(reference.named_parameters())
    plain = torch.optim.AdamW(
        [
            {"params": [params[n] for n in names], "lr": g["lr"]}
            for g, names in zip(fused.param_groups, _group_names(model, fused))
        ],
        lr=train.lr,
        weight_decay=train.weight_decay,
        foreach=False,
    )
    assert not any(g["fused"] or g["foreach"] for g in plain.param_groups)
    x = torch.randn(8, 2)
    for _ in range(5):
        for net, opt in ((model, fused), (reference, plain)):
            opt.zero_grad()
            h = net.backbone(x)
            (
                net.transformer["ffn"](net.transformer["sampling_offsets"](h)).square().sum() + net.frozen(h).sum()
            ).backward()
            opt.step()
    for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(a, b, msg=name)
    assert not torch.equal(model.backbone.weight, _Named().backbone.weight)


def _group_names(model: nn.Module, opt: torch.optim.Optimizer) -> list[list[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names[id(p)] for p in g["params"]] for g in opt.param_groups]


def test_step_lr_drops_tenfold_at_epoch_40_of_50() -> None:
    train = _recipe()
    opt = build_optimizer(_Named(), train)
    sched = build_lr_scheduler(opt, train)
    seen = []
    for _ in range(train.epochs):
        seen.append(dict(current_lrs(opt)))
        opt.step()
        sched.step()
    assert all(s["lr_transformer"] == 1e-4 and s["lr_backbone"] == 2e-5 for s in seen[:40])
    assert all(
        s["lr_transformer"] == pytest.approx(1e-5) and s["lr_backbone"] == pytest.approx(2e-6) for s in seen[40:]
    )


def _run_schedule(train, epochs: int, iters_per_epoch: int, sched=None, opt=None) -> list[float]:
    """The transformer learning rate used by every iteration of ``epochs`` epochs."""
    opt = opt or build_optimizer(_Named(), train)
    sched = sched or build_lr_scheduler(opt, train)
    seen = []
    for _ in range(epochs):
        for _ in range(iters_per_epoch):
            seen.append(current_lrs(opt)["lr_transformer"])
            opt.step()
            sched.step_iteration()
        sched.step()
    return seen


def test_warmup_rises_linearly_then_the_step_drop_applies() -> None:
    train = _recipe("train.lr=1e-3", "train.warmup_iters=4", "train.lr_drop=2")
    seen = _run_schedule(train, epochs=3, iters_per_epoch=3)
    rise = [1e-3 * (0.001 + (1 - 0.001) * i / 4) for i in range(4)]
    assert seen == pytest.approx([*rise, 1e-3, 1e-3, 1e-4, 1e-4, 1e-4])
    assert _run_schedule(_recipe("train.lr=1e-3", "train.lr_drop=2"), epochs=3, iters_per_epoch=1) == pytest.approx(
        [1e-3, 1e-3, 1e-4]
    )  # warmup_iters=0: the plain StepLR


def test_a_drop_inside_the_warmup_multiplies_the_rising_rate() -> None:
    seen = _run_schedule(
        _recipe("train.lr=1e-3", "train.warmup_iters=4", "train.lr_drop=1"), epochs=3, iters_per_epoch=2
    )
    rise = [1e-3 * (0.001 + (1 - 0.001) * i / 4) for i in range(4)]
    assert seen == pytest.approx([rise[0], rise[1], rise[2] * 0.1, rise[3] * 0.1, 1e-5, 1e-5])


def test_schedule_state_resumes_mid_warmup() -> None:
    train = _recipe("train.lr=1e-3", "train.warmup_iters=6", "train.lr_drop=2")
    whole = _run_schedule(train, epochs=4, iters_per_epoch=2)
    opt = build_optimizer(_Named(), train)
    sched = build_lr_scheduler(opt, train)
    first = _run_schedule(train, epochs=1, iters_per_epoch=2, sched=sched, opt=opt)
    opt2 = build_optimizer(_Named(), train)  # built and restored in the order of a resumed run
    sched2 = build_lr_scheduler(opt2, train)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sched.state_dict())
    assert first + _run_schedule(train, epochs=3, iters_per_epoch=2, sched=sched2, opt=opt2) == pytest.approx(whole)


def test_a_bare_step_lr_state_still_loads() -> None:
    train = _recipe("train.lr_drop=1")
    opt = build_optimizer(_Named(), train)
    old = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    opt.step()
    old.step()
    sched = build_lr_scheduler(build_optimizer(_Named(), train), train)
    sched.load_state_dict(old.state_dict())
    assert sched.drop.last_epoch == 1


def test_bad_optimizer_settings_are_config_errors() -> None:
    """The loader refuses them; a TrainConfig made in Python without the loader is checked again."""
    with pytest.raises(ConfigError, match="'train.lr' must be at least 0"):
        _recipe("train.lr=-1e-4")
    with pytest.raises(ConfigError, match="train.lr must not be negative"):
        build_optimizer(_Named(), dataclasses.replace(_recipe(), lr=-1e-4))
    with pytest.raises(ConfigError, match="train.lr_drop"):
        build_lr_scheduler(build_optimizer(_Named(), _recipe()), dataclasses.replace(_recipe(), lr_drop=0))
    with pytest.raises(ConfigError, match="train.warmup_iters must be 0"):
        build_lr_scheduler(build_optimizer(_Named(), _recipe()), dataclasses.replace(_recipe(), warmup_iters=-5))
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ConfigError, match="no trainable parameter"):
        build_optimizer(frozen, _recipe())


def _cpu_bf16(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """Pretend the CPU has (or lacks) AMX and AVX512-BF16."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: native, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native, raising=False)


def test_cpu_mixed_precision_needs_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    for native in (False, True):
        _cpu_bf16(monkeypatch, native)
        check_amp("none", cpu)
        check_amp("auto", cpu)
        with pytest.raises(ConfigError, match="train.amp=fp16 needs a CUDA device"):
            check_amp("fp16", cpu)
    _cpu_bf16(monkeypatch, False)
    with pytest.raises(ConfigError, match="this CPU has no native bfloat16"):
        check_amp("bf16", cpu)
    _cpu_bf16(monkeypatch, True)
    check_amp("bf16", cpu)
    with pytest.raises(ConfigError, match="valid are 'none', 'auto', 'bf16' and 'fp16'"):
        check_amp("int8", cpu)


def test_auto_is_bf16_only_where_native(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    layer = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    for native, dtype in ((False, torch.float32), (True, torch.bfloat16)):
        _cpu_bf16(monkeypatch, native)
        assert native_bf16(cpu) is native
        assert resolve_amp("auto", cpu) == ("bf16" if native else "none")
        assert resolve_amp("none", cpu) == "none"
        with autocast("auto", cpu):
            y = layer(x)
        assert y.dtype == dtype
        torch.testing.assert_close(y.float(), layer(x), atol=0.05, rtol=0.02)
        assert build_grad_scaler("auto", cpu) is None
    with autocast("none", cpu):
        assert layer(x).dtype == torch.float32


def test_evaluation_on_the_cpu_keeps_the_runs_precision_where_native(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    for native in (False, True):
        _cpu_bf16(monkeypatch, native)
        # As the run evaluated at its end; float32 where the CPU would only emulate the dtype.
        assert evaluation_amp("fp16", cpu) == evaluation_amp("none", cpu) == "none"
        assert evaluation_amp("bf16", cpu) == evaluation_amp("auto", cpu) == ("bf16" if native else "none")


def test_outputs_to_float() -> None:
    out = outputs_to_float(
        {
            "a": torch.ones(2, dtype=torch.bfloat16),
            "aux": [{"b": torch.ones(1, dtype=torch.float16), "i": torch.ones(1, dtype=torch.long)}],
        }
    )
    assert out["a"].dtype == torch.float32 and out["aux"][0]["b"].dtype == torch.float32
    assert out["aux"][0]["i"].dtype == torch.long
