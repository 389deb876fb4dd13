"""``detr-peg bench`` end to end in a subprocess, on tiny models and small inputs (bad arguments in this process).

Timings themselves are never asserted (speed is reported by the command, not
tested); what is checked is that every case runs, the table and the JSON
report agree, medians are medians, FLOPs are counted and ratios are relative
to the first row of each mode.
"""

from __future__ import annotations

import json
import statistics

import pytest

from detr_peg.cli import main as cli
from tests.cli_process import CliResult
from tests.conftest import CLI, REPO_ROOT, run_python
from tests.engine.tiny_run import TINY_MODEL
from tests.tools.tool_module import run_main

#: Each test runs its cases in fresh processes.
pytestmark = pytest.mark.slow


def _bench(*args: str) -> CliResult:
    return run_python(*CLI, "bench", *args)


def test_compare_two_encodings_in_both_modes(tmp_path):
    report = tmp_path / "bench.json"
    proc = _bench(
        "--config",
        "configs/detr_r50_sine.yaml",
        *TINY_MODEL,
        "--infer-size",
        "64x96",
        "--train-size",
        "64x64",
        "--runs",
        "2",
        "--rounds",
        "1",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--compare",
        "model.position.name=sine,peg",
        "--peak-size",
        "512",
        "--output",
        str(report),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(report.read_text())["results"]
    assert [(r["label"], r["mode"]) for r in results] == [
        ("name=sine", "infer"),
        ("name=peg", "infer"),
        ("name=sine", "train"),
        ("name=peg", "train"),
    ]
    for r in results:
        assert len(r["runs_seconds"]) == 2 and r.get("rounds", 1) == 1
        assert r["seconds"] == statistics.median(r["runs_seconds"]) > 0
        assert r["flops"] > 0 and r["achieved_flops_per_s"] == pytest.approx(r["flops"] / r["seconds"])
        assert r["peak_memory_bytes"] > 0 and r["threads"] == 1
        assert (r["height"], r["width"]) == ((64, 96) if r["mode"] == "infer" else (64, 64))
    by = {(r["label"], r["mode"]): r for r in results}
    for mode in ("infer", "train"):
        sine, peg = by["name=sine", mode], by["name=peg", mode]
        assert sine["ratio_to_baseline"] == 1.0
        assert peg["ratio_to_baseline"] == pytest.approx(peg["seconds"] / sine["seconds"])
        # The PEG model has the depthwise convolutions on top: more parameters and more FLOPs.
        assert peg["parameters"] > sine["parameters"] and peg["flops"] > sine["flops"]
    # A training step costs more FLOPs than inference of the same model (backward), despite the smaller input.
    assert by["name=sine", "train"]["flops"] > by["name=sine", "infer"]["flops"]
    # The matmul peak of the same run: every row's achieved FLOP/s as a fraction of it, in the JSON and the table.
    peak = json.loads(report.read_text())["matmul_peak"]
    assert (peak["size"], peak["threads"], peak["device"]) == (512, 1, "cpu") and peak["flops_per_s"] > 0
    for r in results:
        assert r["peak_fraction"] == pytest.approx(r["achieved_flops_per_s"] / peak["flops_per_s"])
    assert f"fp32 matmul peak {peak['flops_per_s'] / 1e9:,.1f} GFLOP/s" in proc.stdout
    assert f"{100 * by['name=peg', 'train']['peak_fraction']:.0f}%" in proc.stdout.splitlines()[5]
    table = proc.stdout
    assert table.count("name=sine") == 2 and table.count("name=peg") == 2
    assert f"{by['name=peg', 'infer']['seconds']:.3f}" in table


def test_deformable_inference_only(tmp_path):
    report = tmp_path / "deformable.json"
    proc = _bench(
        "--config",
        "configs/demo.yaml",
        *TINY_MODEL,
        "--modes",
        "infer",
        "--infer-size",
        "96x128",
        "--runs",
        "2",
        "--rounds",
        "2",
        "--warmup",
        "0",
        "--no-flops",
        "--peak-size",
        "0",
        "--output",
        str(report),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(report.read_text())["results"]
    assert (row["label"], row["arch"], row["mode"], row["flops"]) == ("detr_peg", "deformable_detr", "infer", None)
    assert "matmul_peak" not in json.loads(report.read_text()) and "% peak" not in proc.stdout
    # Two rounds (fresh processes) of two runs each, pooled.
    assert len(row["runs_seconds"]) == 4 and row["rounds"] == 2
    assert row["seconds"] == statistics.median(row["runs_seconds"]) > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--infer-size", "800by1066"], "argument --infer-size: must be HEIGHTxWIDTH (for example 800x1066), got"),
        (
            ["--train-size", "16x512"],
            "argument --train-size: must be HEIGHTxWIDTH with both sides from 32 to 8192, got '16x512'",
        ),
        (
            ["--infer-size", "99999x99999"],
            "argument --infer-size: must be HEIGHTxWIDTH with both sides from 32 to 8192",
        ),
        (["--compare", "model.position.name=peg"], "argument --compare: must be KEY=VALUE1,VALUE2"),
        (["--modes", "infer,backward"], "valid modes are infer, train"),
        (["--rounds", "0"], "argument --rounds: must be a whole number of at least 1, got '0'"),
        (["--official", "."], "--official . does not look like the official repository of detr (no models/detr.py)"),
    ],
)
def test_bad_arguments_are_one_line_errors(tmp_path, args, message, capsys, monkeypatch):
    # In this process (the command's exit status and stderr are those of the script, which the tests above run).
    monkeypatch.chdir(REPO_ROOT)
    quick = ["--config", "configs/detr_r50_sine.yaml", *TINY_MODEL, "--runs", "1", "--warmup", "0", "--no-flops"]
    defaults = (["--modes", "infer"] if "--modes" not in args else []) + (
        ["--infer-size", "64x64"] if "--infer-size" not in args else []
    )
    result = run_main(
        cli, capsys, "bench", *quick, "--peak-size", "0", *defaults, *args, "--output", str(tmp_path / "b.json")
    )
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "b.json").exists()


def test_deformable_flops_are_those_of_the_dense_formulation():
    """The embedding_bag backward's sparse products would count as dense ones; FLOPs are counted without them."""
    import torch

    from detr_peg.config import load_config
    from detr_peg.lab.benchmark.measure import count_flops
    from detr_peg.models import build_model
    from detr_peg.models.deformable.ms_deform_attn import MSDeformAttn

    torch.manual_seed(0)
    model = build_model(load_config(REPO_ROOT / "configs/demo.yaml", ["model.num_classes=4"]))
    images, mask = torch.randn(1, 3, 256, 384), torch.zeros(1, 256, 384, dtype=torch.bool)

    def train_step():
        out = model(images, mask)
        (out["pred_logits"].sum() + out["pred_boxes"].sum()).backward()

    # Forward: the two paths do the same dense work (the sampling is not counted by either).
    assert _dense(model, lambda: model(images, mask)) == pytest.approx(
        count_flops(lambda: model(images, mask)), rel=0.01
    )
    assert _dense(model, train_step) < 0.97 * count_flops(train_step)
    assert {m.impl for m in model.modules() if isinstance(m, MSDeformAttn)} == {"embedding_bag"}


def _dense(model, fn) -> int:
    from detr_peg.lab.benchmark.measure import count_flops
    from detr_peg.lab.benchmark.worker import dense_attention

    with dense_attention(model):
        return count_flops(fn)


def test_compare_float32_and_auto_precision_each_against_its_own_peak(tmp_path):
    """``--compare train.amp=none,auto``: the auto row runs in bf16 where the CPU has it, with a bf16 peak."""
    import torch

    from detr_peg.engine.mixed_precision import resolve_amp

    report = tmp_path / "amp.json"
    proc = _bench(
        "--config",
        "configs/demo.yaml",
        *TINY_MODEL,
        "--modes",
        "train",
        "--train-size",
        "64x64",
        "--batch",
        "2",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--compare",
        "train.amp=none,auto",
        "--peak-size",
        "256",
        "--output",
        str(report),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(report.read_text())
    auto = resolve_amp("auto", torch.device("cpu"))
    assert [(r["label"], r["amp"]) for r in data["results"]] == [("amp=none", "none"), ("amp=auto", auto)]
    assert data["matmul_peak"]["dtype"] == "float32"
    peaks = data.get("matmul_peaks", {"none": data["matmul_peak"]})
    assert set(peaks) == {"none", auto}
    for r in data["results"]:
        assert r["peak_fraction"] == pytest.approx(r["achieved_flops_per_s"] / peaks[r["amp"]]["flops_per_s"])
    if auto == "bf16":
        assert peaks["bf16"]["dtype"] == "bfloat16" and "bf16 matmul peak" in proc.stdout
        assert proc.stdout.splitlines()[0].split()[:3] == ["case", "mode", "amp"]
        assert "amp bf16, none" in proc.stdout
    # --amp auto, which check_amp's messages suggest, is the same choice for every case.
    quick = ["--config", "configs/demo.yaml", *TINY_MODEL, "--modes", "infer", "--infer-size", "64x64", "--runs", "1",
             "--warmup", "0", "--no-flops", "--peak-size", "0"]  # fmt: skip
    proc = _bench(*quick, "--amp", "auto", "--output", str(tmp_path / "auto.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["amp"] for r in json.loads((tmp_path / "auto.json").read_text())["results"]] == [auto]


def test_a_compared_precision_this_device_cannot_run_is_refused_before_any_case(tmp_path):
    report = tmp_path / "refused.json"
    proc = _bench(
        "--config",
        "configs/demo.yaml",
        *TINY_MODEL,
        "--modes",
        "train",
        "--compare",
        "train.amp=none,fp16",
        "--peak-size",
        "0",
        "--output",
        str(report),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "detr-peg bench: error: train.amp=fp16 needs a CUDA device; on the CPU use train.amp=bf16 or auto."
    ]
    assert "Traceback" not in proc.stderr and proc.stdout == "" and not report.exists()


def test_an_explicit_amp_replaces_the_compared_configs_precision(tmp_path):
    """With --amp, the configs' own train.amp is not used, so it is not refused either."""
    import torch

    from detr_peg.engine.mixed_precision import native_bf16

    if not native_bf16(torch.device("cpu")):
        pytest.skip("--amp bf16 needs a CPU with native bfloat16 (AMX or AVX512-BF16)")
    report = tmp_path / "explicit.json"
    proc = _bench(
        "--config",
        "configs/demo.yaml",
        *TINY_MODEL,
        "--modes",
        "infer",
        "--infer-size",
        "64x64",
        "--amp",
        "bf16",
        "--compare",
        "train.amp=none,fp16",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--peak-size",
        "0",
        "--no-flops",
        "--output",
        str(report),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(report.read_text())["results"]
    assert [(r["label"], r["amp"]) for r in rows] == [("amp=none", "bf16"), ("amp=fp16", "bf16")]
