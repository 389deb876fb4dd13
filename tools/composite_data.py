"""Write the copy-paste composite proxy (real COCO objects on real backgrounds) and print its statistics.

Splits ``train``, ``tune``, ``val`` and ``test``, each from its own source images
(:mod:`detr_peg.lab.study.composite_data`); the statistics (objects per image, COCO
size classes, aspect ratios, touching or overlapping objects, token grids) are
also in ``OUTPUT/summary.json``.

    python tools/composite_data.py --source ../shared/data/coco128 --output outputs/composite
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from detr_peg.lab.study.composite_data import SPLITS, CompositeOptions, generate_composites  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, required=True,
                        help="a folder with images/, annotations_train.json and annotations_val.json")  # fmt: skip
    parser.add_argument("--output", type=Path, required=True, help="the folder to write")
    parser.add_argument("--size", type=int, default=CompositeOptions.size, help="image side in pixels (320)")
    parser.add_argument("--counts", default=",".join(map(str, CompositeOptions.counts)),
                        help=f"images per split ({', '.join(SPLITS)}), comma-separated")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    missing = [
        n for n in ("images", "annotations_train.json", "annotations_val.json") if not (args.source / n).exists()
    ]
    if missing:
        print(f"composite_data: error: --source {args.source} has no {', '.join(missing)}.", file=sys.stderr)
        return 2
    try:
        counts = tuple(int(c) for c in args.counts.split(","))
    except ValueError:
        counts = ()
    if len(counts) != len(SPLITS) or min(counts) < 0 or args.size < 32:
        print(f"composite_data: error: --counts {args.counts} must be {len(SPLITS)} counts >= 0 and --size "
              f"{args.size} at least 32.", file=sys.stderr)  # fmt: skip
        return 2
    options = CompositeOptions(size=args.size, counts=counts, seed=args.seed)
    summary = generate_composites(args.source, args.output, options)
    for split, stats in summary["splits"].items():
        shown = {k: v for k, v in stats.items() if not k.startswith("source_")}
        print(f"{split}: {len(stats['source_images'])} source images; {json.dumps(shown)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
