"""``python tools/train.py ...`` is ``detr-peg train ...`` for those who expect a script (see ``detr-peg train --help``).

Under torchrun: ``torchrun --nproc_per_node 8 tools/train.py --config ...``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from detr_peg.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
