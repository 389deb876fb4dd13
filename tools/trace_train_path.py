"""Which project files run on the way from `detr-peg train` to the first training iteration.

Runs a tiny `detr-peg train` (synthetic data, one iteration) in this process
with ``sys.setprofile`` and records every function called, until the model's
first forward pass in training. The files of the command line and the engine
(``detr_peg/cli``, ``detr_peg/engine``) are the orchestration a reader
follows from the command to the loop, the measure of "files crossed"; the
rest (the model, the data pipeline, the config system, the checks on files
and outputs) is listed apart.

    python tools/trace_train_path.py            # prints the files, grouped, with the call count of each
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ORCHESTRATION = ("detr_peg/cli/", "detr_peg/engine/")


class _FirstIteration(Exception):
    pass


def trace(root: Path) -> Counter:
    sys.path.insert(0, str(root))
    from detr_peg.cli.main import main
    from detr_peg.data.synthetic import generate_synthetic_coco

    with tempfile.TemporaryDirectory() as tmp:
        data = generate_synthetic_coco(Path(tmp) / "data", num_train=4, num_val=2, image_size=64, progress=False)
        args = ["train", "--output", str(Path(tmp) / "run"), "model.backbone.name=resnet18",
                "model.backbone.weights=null", "model.backbone.norm=bn", "model.backbone.out_stages=[3]",
                "model.transformer.hidden_dim=32", "model.transformer.nheads=2", "model.transformer.enc_layers=1",
                "model.transformer.dec_layers=1", "model.transformer.dim_feedforward=64", "model.num_queries=4",
                "train.batch_size=2", "train.max_iters=1", "train.device=cpu", "data.num_workers=0",
                *[f"data.{k}={v}" for k, v in data.data_overrides().items()]]  # fmt: skip
        calls: Counter = Counter()
        package = str(root / "detr_peg")

        def profile(frame, event, arg):
            if event != "call":
                return
            filename = frame.f_code.co_filename
            # Functions only: module and class bodies (imports) have no CO_OPTIMIZED flag.
            if filename.startswith(package) and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
                calls[str(Path(filename).relative_to(root))] += 1
                if frame.f_code.co_name == "forward" and "detr_peg/models/" in filename and _training(frame):
                    raise _FirstIteration

        sys.setprofile(profile)
        try:
            main(args)
        except _FirstIteration:
            pass
        finally:
            sys.setprofile(None)
    return calls


def _training(frame) -> bool:
    module = frame.f_locals.get("self")
    import torch

    return isinstance(module, torch.nn.Module) and module.training and hasattr(module, "backbone")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=REPO, help="the repository to trace (default: this one)")
    args = parser.parse_args()
    calls = trace(args.root.resolve())
    path = sorted(f for f in calls if f.startswith(ORCHESTRATION))
    apart = sorted(f for f in calls if not f.startswith(ORCHESTRATION))
    print(f"Orchestration (cli, engine): {len(path)} files on the way from `detr-peg train` to the first iteration")
    for f in path:
        print(f"  {f}  ({calls[f]} calls)")
    print(f"Everything else (model, data, config, file and output checks): {len(apart)} files")
    for f in apart:
        print(f"  {f}  ({calls[f]} calls)")


if __name__ == "__main__":
    main()
