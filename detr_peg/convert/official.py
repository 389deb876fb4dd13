"""Converting official DETR-family checkpoints: weights fix the architecture; config file, args, overrides the rest."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from torch import Tensor

import detr_peg.convert.deformable  # noqa: F401  (registers the Deformable-DETR format)
import detr_peg.convert.detr  # noqa: F401  (registers the DETR format)
from detr_peg.checkpoint.files import is_safetensors, read_checkpoint_file
from detr_peg.checkpoint.format import FORMAT
from detr_peg.config.loader import Layer, dotted_layer, file_layers, parse_overrides
from detr_peg.config.schema import Config
from detr_peg.convert.registry import OFFICIAL_FORMATS, OfficialFormat
from detr_peg.convert.report import ConversionReport, fit_to_model, map_state_dict, resolve_layers
from detr_peg.convert.source_kind import NO_CONVERSION, OFFICIAL_FILE
from detr_peg.errors import CheckpointError


def _load_official(src: str) -> tuple[dict[str, Tensor], dict[str, Any] | None, list[str]]:
    obj = read_checkpoint_file(src, what=OFFICIAL_FILE)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{src} does not hold a checkpoint dict (found {type(obj).__name__}).")
    safetensors = is_safetensors(src)
    if (obj["metadata"] if safetensors else obj).get("format") == FORMAT:
        raise CheckpointError(
            NO_CONVERSION.format(src=src) + "it to eval or predict as --checkpoint, or to Detector.from_checkpoint."
        )
    if safetensors:
        return obj["state_dict"], None, []
    state = obj.get("model", obj)
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(f"{src} has no 'model' state dict of tensors.")
    args = obj.get("args")
    if args is not None and not isinstance(args, dict):
        args = getattr(args, "__dict__", None)  # the official code's argparse Namespace
        if not isinstance(args, dict):
            raise CheckpointError(f"{src}: 'args' is a {type(obj['args']).__name__}, not the official code's options.")
    ignored = sorted(k for k in obj if k != "model") if "model" in obj else []
    return state, args, ignored


def detect_format(state: dict[str, Tensor], src: str) -> OfficialFormat:
    """The registered official format whose layout ``state`` has."""
    found = [OFFICIAL_FORMATS.get(n) for n in OFFICIAL_FORMATS.names() if OFFICIAL_FORMATS.get(n).matches(state)]
    if len(found) == 1:
        return found[0]
    valid = ", ".join(OFFICIAL_FORMATS.get(n).name for n in OFFICIAL_FORMATS.names())
    raise CheckpointError(f"{src} is not a checkpoint of a known official codebase ({valid}).")


def _args_layer(args: dict[str, Any], fmt: OfficialFormat, source: str) -> Layer:
    values: dict[str, Any] = {}
    for name, target in fmt.args_map.items():
        if name not in args or args[name] is None:
            continue
        if callable(target):
            values.update(target(args[name]))
        else:
            values[target] = args[name]
    return dotted_layer(values, source)


class _Tensors(dict):
    """A state dict whose missing key is the checkpoint's fault: a CheckpointError with ``message`` naming it."""

    def __init__(self, state: dict[str, Tensor], message: str) -> None:
        super().__init__(state)
        self.message = message

    def __missing__(self, key: str) -> Tensor:
        raise CheckpointError(self.message.format(key))


def resolve_config(
    state: dict[str, Tensor],
    args: dict[str, Any] | None,
    fmt: OfficialFormat,
    src: str,
    config_path: str | os.PathLike | None,
    overrides: Iterable[str],
) -> Config:
    """Merge config file, stored args and overrides around what the weights determine (see ``convert.report``)."""
    state = _Tensors(state, f"{src} has no '{{}}', which every {fmt.name} checkpoint has: it is damaged or incomplete.")
    hard, soft = fmt.infer(state)
    if not args and fmt.untold is not None:
        given = set(parse_overrides(overrides)).union(*(file_layers(config_path) if config_path else []))
        missing = [key for key in fmt.untold(hard) if key not in given]
        if missing:
            raise CheckpointError(
                f"{src} stores no 'args', and its weights do not tell {' and '.join(missing)}; give "
                f"{'them' if len(missing) > 1 else 'it'} as key=value (or in --config), as the model was trained."
            )
    stored = _args_layer(args, fmt, f"args stored in {src}") if args else None
    complete = (lambda cfg: fmt.complete(state, cfg)) if fmt.complete is not None else None
    return resolve_layers(hard, soft, src, config_path, overrides, stored=stored, complete=complete)


def convert_official(
    src: str | os.PathLike, *, config_path: str | os.PathLike | None = None, overrides: Iterable[str] = ()
) -> ConversionReport:
    """Convert an official checkpoint (``.pth``, bare state dict or ``.safetensors``) in memory; the report."""
    src = os.fsdecode(src)
    state, args, ignored = _load_official(src)
    fmt = detect_format(state, src)
    cfg = resolve_config(state, args, fmt, src, config_path, overrides)
    mapped, aliases = map_state_dict(state, fmt.key_map, src)
    merged, new_keys, unused = fit_to_model(cfg, mapped, src)
    return ConversionReport(fmt.name, cfg, merged, new_keys, unused, aliases, ignored)
