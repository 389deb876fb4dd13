#!/usr/bin/env python
"""Benchmark a detr_peg config: ``python tools/bench.py --config FILE [...]`` (same as ``detr-peg bench``)."""

import sys

from detr_peg.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
