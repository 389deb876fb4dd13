"""``eval --scales`` (validation images resized by ``s``) and ``--canvas-scales`` (synthetic sets drawn on an ``s``
times larger canvas: objects keep their size, only the token grid grows); scale 1.0 is the ordinary evaluation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from detr_peg.checkpoint.format import Checkpoint, read_checkpoint
from detr_peg.config.ranges import MAX_TEST_SIDE, MIN_IMAGE_SIDE, is_number
from detr_peg.config.schema import Config, DataConfig
from detr_peg.data.coco_dataset import build_coco_dataset
from detr_peg.data.synthetic import larger_canvas, object_sides, read_manifest
from detr_peg.engine.distributed import DistEnv, on_main, process_group
from detr_peg.engine.evaluation.evaluate import evaluate_dataset
from detr_peg.engine.evaluation.metric_units import UNIT, format_percent
from detr_peg.engine.evaluation.padding import (
    PADDING_JSON,
    PADDING_RUNS,
    measure_padding,
)
from detr_peg.engine.evaluation.run import eval_io, load_for_evaluation, source_of
from detr_peg.errors import ConfigError, DataError
from detr_peg.models.loading import LoadedModel
from detr_peg.outputs import guard_outputs, write_json

logger = logging.getLogger(__name__)

RESIZED_JSON = "scales_resized.json"
CANVAS_JSON = "scales_canvas.json"


def scaled_data(data: DataConfig, scale: float) -> DataConfig:
    """``data`` with ``val_scale`` and ``val_max_size`` multiplied by ``scale`` (rounded to whole pixels)."""
    return dataclasses.replace(
        data, val_scale=round(data.val_scale * scale), val_max_size=round(data.val_max_size * scale)
    )


def synthetic_params(data: DataConfig) -> tuple[Path, dict[str, Any]]:
    """Folder and generator arguments of the synthetic dataset of ``data.val_annotations``; ConfigError if none."""
    root = Path(data.val_annotations or ".").parent
    params = read_manifest(root)
    if params is None:
        raise ConfigError(
            f"--canvas-scales needs a synthetic dataset, but there is no complete manifest.json of "
            f"detr_peg.data.synthetic next to data.val_annotations ({data.val_annotations}); use --scales for "
            "other datasets."
        )
    return root, params


def check_scales(data: DataConfig, scales: Sequence[float], canvas_scales: Sequence[float]) -> None:
    """Refuse scales not positive and finite, repeated, or sizing images beyond ``MAX_TEST_SIDE``/``MIN_IMAGE_SIDE``.

    Raises:
        ConfigError: naming the option, the value and the range accepted.
    """
    base = max(data.val_scale, data.val_max_size or 0)
    smallest = min((("data.val_scale", data.val_scale), ("data.val_max_size", data.val_max_size)), key=lambda f: f[1])
    for name, values in (("--scales", scales), ("--canvas-scales", canvas_scales)):
        if not isinstance(values, (list, tuple)) or not all(is_number(v) for v in values):  # not a string either
            raise ConfigError(f"{name} must be a list or tuple of positive numbers, got {values!r}.")
        for i, value in enumerate(values):
            if value in values[:i]:
                raise ConfigError(f"{name} gives the scale {value:g} twice; give each scale once.")
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"{name} must be positive numbers, got {value!r}.")
            if base * value > MAX_TEST_SIDE:
                raise ConfigError(
                    f"{name} {value:g} gives images of up to {base * value:,.0f} px (data.val_scale / "
                    f"data.val_max_size {base} x {value:g}), more than the {MAX_TEST_SIDE} px accepted; "
                    f"use scales up to {MAX_TEST_SIDE / base:.3g}."
                )
            field, size = smallest
            if round(size * value) < MIN_IMAGE_SIDE:
                raise ConfigError(
                    f"{name} {value:g} makes {field} {round(size * value)} px ({size} x {value:g}), below the "
                    f"{MIN_IMAGE_SIDE} px accepted; use scales of at least "
                    f"{math.ceil((MIN_IMAGE_SIDE - 0.5) / size * 1000) / 1000:g}."
                )


def canvas_side(params: dict[str, Any], scale: float) -> int:
    """The canvas side (pixels) of ``scale``; ConfigError below 32 px or the dataset's largest object."""
    side = round(params["image_size"] * scale)
    largest = object_sides(params["reference_size"])[1]
    if side < max(32, largest):
        raise ConfigError(
            f"--canvas-scales {scale:g} gives a {side} px canvas, too small for the dataset's objects (up to "
            f"{largest} px) or below 32 px; use scales of at least {max(32, largest) / params['image_size']:.3g}."
        )
    return side


def canvas_data(data: DataConfig, scale: float) -> DataConfig:
    """The data config of the larger-canvas set at ``scale``, generated into ``<dataset>/canvas_<side>/`` if missing."""
    root, params = synthetic_params(data)
    if scale == 1:
        return data
    side = canvas_side(params, scale)
    try:
        made = larger_canvas(params, scale, root / f"canvas_{side}")
    except DataError as exc:
        raise ConfigError(f"Could not write the larger-canvas set for --canvas-scales {scale:g}: {exc}") from None
    return scaled_data(
        dataclasses.replace(data, val_images=str(made.val_images), val_annotations=str(made.val_annotations)), scale
    )


def evaluate_data(loaded: LoadedModel, data: DataConfig, env: DistEnv, amp: str) -> dict[str, Any]:
    """``{"size": short side, "num_images", "metrics"}`` of ``loaded`` on the validation set of ``data`` (no files)."""
    dataset = build_coco_dataset(data, "val", label_map=loaded.label_map)
    out = evaluate_dataset(loaded, dataset, env, amp=amp)
    return {"size": data.val_scale, "num_images": out.num_images, "metrics": out.metrics}


def run_scale_evaluation(
    cfg: Config,
    checkpoint: str | Path | Checkpoint | LoadedModel,
    output_dir: str | Path,
    *,
    scales: Sequence[float] = (),
    canvas_scales: Sequence[float] = (),
    padding: bool = False,
    progress_bars: bool | None = None,
) -> dict[str, Path]:
    """Evaluate ``checkpoint`` at ``scales`` and ``canvas_scales``, and measure padding sensitivity with ``padding``.

    Writes ``scales_resized.json`` / ``scales_canvas.json`` (``{"kind", "base_size", "results": [{"scale", "size",
    "num_images", "metrics"}]}``) and ``padding.json``; returns them by kind, empty outside the main process.

    Raises:
        UserError: bad scales, ``canvas_scales`` on non-synthetic data, a feature map larger than a learned
            encoding's table, an unwritable output folder.
    """
    check_scales(cfg.data, scales, canvas_scales)
    scales, canvas_scales = [float(s) for s in scales], [float(s) for s in canvas_scales]  # NumPy's too
    with process_group(cfg.train.device) as env, contextlib.ExitStack() as claims:
        owned = on_main(env, lambda: guard_outputs("eval", *eval_io(cfg, source_of(checkpoint), output_dir)))
        claims.enter_context(owned or contextlib.nullcontext())  # a refusal below leaves no folder it made
        out = Path(output_dir)
        # Every canvas set is checked and generated (by the main process alone) before the first evaluation.
        on_main(env, lambda: [canvas_data(cfg.data, s) for s in canvas_scales])
        canvas_sets = [(s, canvas_data(cfg.data, s)) for s in canvas_scales]
        if not isinstance(checkpoint, (Checkpoint, LoadedModel)):
            checkpoint = read_checkpoint(checkpoint)
        loaded, dataset, amp = load_for_evaluation(cfg, checkpoint, env)
        total = len(scales) + len(canvas_sets) + (len(PADDING_RUNS) if padding else 0)
        show = env.is_main and (bool(sys.stderr and sys.stderr.isatty()) if progress_bars is None else progress_bars)
        bar = tqdm(total=total, desc="evaluations", disable=not show, dynamic_ncols=True)
        reports: dict[str, Any] = {}
        try:
            if scales:
                sets = [(s, scaled_data(cfg.data, s)) for s in scales]
                reports["resized"] = _sweep("resized", loaded, cfg.data, sets, env, amp, bar)
            if canvas_sets:
                reports["canvas"] = _sweep("canvas", loaded, cfg.data, canvas_sets, env, amp, bar)
            if padding:
                reports["padding"] = measure_padding(loaded, dataset, env, amp, on_run=lambda _: bar.update(1))
        finally:
            bar.close()
        names = {"resized": RESIZED_JSON, "canvas": CANVAS_JSON, "padding": PADDING_JSON}
        written = on_main(
            env, lambda: {kind: write_json(out / names[kind], report) for kind, report in reports.items()}
        )
        if env.is_main:
            _print_summary(reports)
        return written or {}


def _sweep(
    kind: str,
    loaded: LoadedModel,
    base: DataConfig,
    sets: list[tuple[float, DataConfig]],
    env: DistEnv,
    amp: str,
    bar: tqdm,
) -> dict[str, Any]:
    results = []
    for scale, data in sets:
        bar.set_postfix_str(f"{kind} x{scale:g}")
        results.append({"scale": float(scale), **evaluate_data(loaded, data, env, amp)})
        bar.update(1)
    return {"kind": kind, "unit": UNIT, "base_size": base.val_scale, "results": results}


def _print_summary(reports: dict[str, Any]) -> None:
    for kind in ("resized", "canvas"):
        for entry in reports.get(kind, {}).get("results", []):
            shown = "  ".join(f"{name} {format_percent(entry['metrics'][name], 7)}" for name in ("AP", "AP50", "AP75"))
            logger.info(
                f"{kind:<7} x{entry['scale']:<5g} short side {entry['size']:>5} px, {entry['num_images']} images: "
                f"{shown}"
            )
    if "padding" in reports:
        report = reports["padding"]
        for mode, entry in report["modes"].items():
            logger.info(
                f"padding {mode:<6} batch {entry['batch_size']:>3}: AP {format_percent(entry['metrics']['AP'], 7)}  "
                f"{entry['seconds']:.2f} s"
            )
        logger.info(
            f"padding: largest logit difference mixed vs single {report['max_abs_logit_diff_mixed_vs_single']:.3g}, "
            f"exact vs single {report['max_abs_logit_diff_exact_vs_single']:.3g}"
        )
