"""The package's weight in figures: what a reader must take in, and how far a value or an image travels.

    python tools/layout_figures.py          # prints the figures, one per line
    python tools/layout_figures.py --json   # the same as one JSON object (tests/test_layout.py reads it)

Static figures (no import of the package): lines of the core (``detr_peg/`` outside
``detr_peg/lab``) and of the lab, the docstrings' share of the core's lines, the lines of the
defensive modules (``DEFENSIVE``), import circles between modules, tracked files.

Traced figures (a tiny run in this process, with ``sys.setprofile``):

* config path: the project files whose functions receive the value of ``train.lr`` (as the
  command-line word, the number, or inside a dict, list or object holding it) on the way from
  ``detr-peg train ... train.lr=<v>`` to the construction of AdamW;
* predict path: the project files outside ``detr_peg/models`` whose functions run inside
  ``Detector.predict(<image path>)`` of a checkpoint;
* train path: the files of the command line and the engine (``detr_peg/cli``, ``detr_peg/engine``)
  whose functions run from ``detr-peg train`` to the model's first forward pass in training.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = "detr_peg/lab/"
#: Modules whose only concern is refusing bad input or protecting outputs (they hold no detector logic).
DEFENSIVE = (
    "detr_peg/outputs.py",
    "detr_peg/bounded_read.py",
    "detr_peg/checkpoint/resume_rules.py",
    "detr_peg/config/ranges.py",
    "detr_peg/models/argument_checks.py",
    "detr_peg/checkpoint/validation.py",
    "detr_peg/checkpoint/weights_check.py",
)
LR = 0.000123


def package_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "detr_peg").rglob("*.py") if "__pycache__" not in p.parts)


def lines_and_docstrings(path: Path) -> tuple[int, int]:
    """(lines, lines inside docstrings) of one file."""
    text = path.read_text(encoding="utf-8")
    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                if isinstance(body[0].value.value, str):
                    doc_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return len(text.splitlines()), len(doc_lines)


def import_circles(root: Path) -> list[list[str]]:
    """Strongly connected groups of more than one module in the package's import graph."""
    modules = {}
    for path in package_files(root):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):  # every import, function-local and TYPE_CHECKING ones too
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return _strongly_connected(graph)


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    names = sorted(graph)
    index = {n: i for i, n in enumerate(names)}
    rows = [index[a] for a in names for _ in graph[a]]
    cols = [index[b] for a in names for b in sorted(graph[a])]
    matrix = csr_matrix(([1] * len(rows), (rows, cols)), shape=(len(names), len(names)))
    _, labels = connected_components(matrix, directed=True, connection="strong")
    groups: dict[int, list[str]] = {}
    for name, label in zip(names, labels):
        groups.setdefault(int(label), []).append(name)
    return sorted(g for g in groups.values() if len(g) > 1)


def static_figures(root: Path) -> dict:
    core = lab = core_doc = defensive = 0
    for path in package_files(root):
        rel = path.relative_to(root).as_posix()
        lines, doc = lines_and_docstrings(path)
        if rel.startswith(LAB):
            lab += lines
        else:
            core += lines
            core_doc += doc
        if rel.startswith(DEFENSIVE):
            defensive += lines
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    return {
        "core_lines": core,
        "lab_lines": lab,
        "core_docstring_share": round(core_doc / core, 3),
        "defensive_lines": defensive,
        "import_circles": import_circles(root),
        "tracked_files": len(tracked.splitlines()),
    }


def _carries(value, depth: int = 0) -> bool:
    """Whether ``value`` is, or holds, the traced learning rate."""
    if isinstance(value, float):
        return value == LR
    if isinstance(value, str):
        return str(LR) in value
    if depth >= 4 or isinstance(value, (int, bool, bytes, type(None))):
        return False
    if isinstance(value, dict):
        return any(_carries(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_carries(v, depth + 1) for v in value[:64])
    fields = getattr(value, "__dict__", None)
    if isinstance(fields, dict) and type(value).__module__.startswith("detr_peg"):
        return any(_carries(v, depth + 1) for v in fields.values())
    return False


class _Reached(Exception):
    pass


def _training_forward(frame) -> bool:
    import torch

    module = frame.f_locals.get("self")
    return (
        frame.f_code.co_name == "forward"
        and isinstance(module, torch.nn.Module)
        and module.training
        and hasattr(module, "backbone")
    )


def _tiny_train_args(tmp: Path, root: Path) -> list[str]:
    from detr_peg.data.synthetic import generate_synthetic_coco

    data = generate_synthetic_coco(tmp / "data", num_train=4, num_val=2, image_size=64, progress=False)
    return ["train", "--output", str(tmp / "run"), "model.backbone.name=resnet18",
            "model.backbone.weights=null", "model.backbone.norm=bn", "model.backbone.out_stages=[3]",
            "model.transformer.hidden_dim=32", "model.transformer.nheads=2", "model.transformer.enc_layers=1",
            "model.transformer.dec_layers=1", "model.transformer.dim_feedforward=64", "model.num_queries=4",
            "train.batch_size=2", "train.max_iters=1", "train.device=cpu", "data.num_workers=0",
            *[f"data.{k}={v}" for k, v in data.data_overrides().items()]]  # fmt: skip


def _traced(profile, main, args: list[str]) -> None:
    """Run ``main(args)`` under ``profile`` until the profile stops it; a run that ends first failed to get there."""
    sys.setprofile(profile)
    try:
        status = main(args)
    except _Reached:
        return
    finally:
        sys.setprofile(None)
    raise SystemExit(f"layout_figures: the traced run ended (status {status}) before the point it measures to.")


def traced_figures(root: Path) -> dict:
    sys.path.insert(0, str(root))
    from detr_peg import Detector
    from detr_peg.cli.main import main

    package = str(root / "detr_peg")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        args = _tiny_train_args(tmp, root)
        train_files: set[str] = set()

        def on_train(frame, event, arg):
            code = frame.f_code
            if event == "call" and code.co_filename.startswith(package) and code.co_flags & inspect.CO_OPTIMIZED:
                rel = Path(code.co_filename).relative_to(root).as_posix()
                if rel.startswith(("detr_peg/cli/", "detr_peg/engine/")):
                    train_files.add(rel)
                elif rel.startswith("detr_peg/models/") and _training_forward(frame):
                    raise _Reached

        _traced(on_train, main, args)
        if main([*args[:2], str(tmp / "ckpt"), *args[3:]]) != 0:  # the checkpoint that the predict path loads
            raise SystemExit("layout_figures: the tiny training run failed; the traced figures would be partial.")
        config_files: set[str] = set()

        def on_config(frame, event, arg):
            if event != "call":
                return
            code = frame.f_code
            if code.co_name == "__init__" and code.co_filename.endswith("torch/optim/adamw.py"):
                raise _Reached
            if code.co_filename.startswith(package) and code.co_flags & inspect.CO_OPTIMIZED:
                if any(_carries(v) for v in frame.f_locals.values()):
                    config_files.add(Path(code.co_filename).relative_to(root).as_posix())

        run_args = [*args[:2], str(tmp / "run_lr"), *args[3:], f"train.lr={LR}"]
        _traced(on_config, main, run_args)

        detector = Detector.from_checkpoint(tmp / "ckpt" / "checkpoint.pth", device="cpu")
        image = next((tmp / "data" / "val").glob("*.png"))
        predict_files: set[str] = set()

        def on_predict(frame, event, arg):
            filename = frame.f_code.co_filename
            if event == "call" and filename.startswith(package) and "detr_peg/models/" not in filename:
                predict_files.add(Path(filename).relative_to(root).as_posix())

        sys.setprofile(on_predict)
        try:
            detector.predict(str(image))
        finally:
            sys.setprofile(None)
    return {
        "config_path_files": sorted(config_files),
        "predict_path_files": sorted(predict_files),
        "train_path_files": sorted(train_files),
    }


def main() -> None:
    from detr_peg.cli.main import OneLineParser  # one-line errors, as the commands give

    parser = OneLineParser(
        prog="layout_figures.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=REPO, help="the repository to measure (default: this one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--static", action="store_true", help="only the figures that need no run")
    args = parser.parse_args()
    root = args.root.resolve()
    if not (root / "detr_peg").is_dir():
        parser.error(f"--root {args.root} is not a detr_peg repository (no detr_peg/ folder in it).")
    figures = static_figures(root)
    if not args.static:
        out = io.StringIO()
        stdout, sys.stdout = sys.stdout, out  # the runs' own output is not part of the figures
        try:
            figures.update(traced_figures(root))
        finally:
            sys.stdout = stdout
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    for key, value in figures.items():
        if isinstance(value, list):
            print(f"{key}: {len(value)}")
            for item in value:
                print(f"  {item}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
