"""``python -m detr_peg``: the ``detr-peg`` command line."""

from detr_peg.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
