"""The ``detr-peg`` command line (one module per command)."""
