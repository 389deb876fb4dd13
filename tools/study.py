"""``python tools/study.py ...`` is ``detr-peg study ...`` for those who expect a script (see ``detr-peg study --help``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from detr_peg.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["study", *sys.argv[1:]]))
