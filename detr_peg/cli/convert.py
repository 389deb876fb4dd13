"""Convert an official DETR or Deformable-DETR checkpoint into a detr_peg checkpoint.

The architecture is read from the weights (backbone depth, widths, layer
counts, queries, classes). What the weights do not determine (attention heads,
dilation, ...) comes from the ``args`` stored by the official training script
when present, then from --config and key=value overrides, as for training.
Use model.position.name=peg to start a PEG model from official weights: every
shared weight is kept and only the PEG is initialised.

Example:
  detr-peg convert detr-r50-e632da11.pth detr_r50.pth
  detr-peg convert detr-r50-e632da11.pth detr_r50_peg.pth model.position.name=peg
"""

from __future__ import annotations

import argparse
import contextlib

from detr_peg.cli import option_types
from detr_peg.config.options import own_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("src", help="official checkpoint (.pth with 'model', bare state dict, or .safetensors)")
    parser.add_argument("dst", help="output detr_peg checkpoint (.pth, or .safetensors for weights + config)")
    parser.add_argument(
        "--config",
        type=option_types.config_file,
        metavar="FILE",
        help="config file or shipped config name for values the weights do not determine",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")


def _preview(keys: list[str], limit: int = 20) -> str:
    shown = "\n    ".join(keys[:limit])
    more = f"\n    ... and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"\n    {shown}{more}" if keys else " none"


def run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as claims:  # the output folders' claims, settled on leaving
        from detr_peg.convert import convert_official_file
        from detr_peg.guards.declared_io import convert_io
        from detr_peg.guards.output_guard import guard_outputs

        claims.enter_context(guard_outputs("convert", *convert_io(args.src, args.dst, args.config)))
        report = convert_official_file(args.src, args.dst, config_path=args.config, overrides=args.overrides)
        m = report.config.model
        t = m.transformer
        print(
            f"Converted {report.source_format} checkpoint {args.src} -> {args.dst}\n"
            f"  model: {m.arch}, backbone {m.backbone.name}, position {m.position.name}, hidden {t.hidden_dim}, "
            f"heads {t.nheads}, layers {t.enc_layers}+{t.dec_layers}, queries {m.num_queries}, classes {m.num_classes}"
            + "".join(
                f", {key.rpartition('.')[2]} {value}"
                for key, value in own_options(report.config).items()
                if key.startswith("model.")
            )
        )
        print(f"  new keys (initialised fresh): {len(report.new_keys)}{_preview(report.new_keys)}")
        print(f"  unused keys: {len(report.unused_keys)}{_preview(report.unused_keys)}")
        if report.aliases:
            print(f"  alias keys of shared modules (identical, stored once): {len(report.aliases)}")
        if report.ignored_entries:
            print(f"  other entries not converted: {', '.join(report.ignored_entries)}")
        return 0
