"""``python -m detr_peg``: the ``detr-peg`` command line."""

from detr_peg.cli.main import main

raise SystemExit(main())
