"""Convert an official DETR or Deformable-DETR checkpoint, or a Transformers one, into a detr_peg checkpoint.

SRC is an official checkpoint file (.pth, or .safetensors), a folder of a
Transformers DetrForObjectDetection or DeformableDetrForObjectDetection
(config.json and model.safetensors or pytorch_model.bin), or the Hugging Face
Hub name of one (owner/name; offline, pass a local folder). The architecture is
read from the weights and config.json, a Transformers label map from id2label.
What they do not determine (an official checkpoint's attention heads, dilation,
...) comes from the official script's stored ``args`` when present, then from
--config and key=value overrides. A Transformers setting detr_peg cannot
represent is refused, naming the config.json field. model.position.name=peg
starts a PEG model from the weights: only the PEG is initialised.

Example:
  detr-peg convert detr-r50-e632da11.pth detr_r50.pth
  detr-peg convert detr-r50-e632da11.pth detr_r50_peg.pth model.position.name=peg
  detr-peg convert facebook/detr-resnet-50 detr_r50_hf.pth
  detr-peg convert ./my-finetuned-detr detr_finetuned.pth
"""

from __future__ import annotations

import argparse
import contextlib

from detr_peg.cli import option_types
from detr_peg.config.options import own_options
from detr_peg.messages import listed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("src",
                        help="official checkpoint (.pth with 'model', bare state dict, or .safetensors), a "
                             "Transformers folder (config.json + weights) or a Hugging Face "
                             "Hub name (owner/name)")  # fmt: skip
    parser.add_argument("dst", help="output detr_peg checkpoint (.pth, or .safetensors for weights + config)")
    parser.add_argument("--config", type=option_types.config_file, metavar="FILE",
                        help="config file or shipped config name for values the weights do not determine")  # fmt: skip
    parser.add_argument("overrides", nargs="*", default=[], metavar="key=value", help="config overrides")


def _preview(keys: list[str], limit: int = 20) -> str:
    shown = "\n    ".join(keys[:limit])
    more = f"\n    ... and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"\n    {shown}{more}" if keys else " none"


def run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as claims:  # the output folders' claims, settled on leaving
        from detr_peg.config.loader import check_config_file
        from detr_peg.convert.source_kind import check_source

        # Inputs that are not there are refused before torch and the models are imported.
        check_source(args.src)
        if args.config:
            check_config_file(args.config)

        from detr_peg.convert import convert_file
        from detr_peg.outputs import Output, guard_outputs, inputs

        reads = inputs((args.src, "SRC"), (args.config, "--config"))
        claims.enter_context(guard_outputs("convert", reads, [Output(args.dst, "DST")]))
        report = convert_file(args.src, args.dst, config_path=args.config, overrides=args.overrides)
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
        if report.label_map:
            names = report.label_map["names"]
            print(f"  label map: {len(names)} categories ({listed(names, 5)})")
        if report.ignored_entries:
            print(f"  other entries not converted: {', '.join(report.ignored_entries)}")
        return 0
