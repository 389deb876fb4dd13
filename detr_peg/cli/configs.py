"""List the configs shipped with the package, or copy one out for editing.

Every --config (and --study) accepts a shipped config's name as well as a file
(--config detr_r50_peg, --study study/proxy_synthetic). A copy refers to the
shipped files it builds on by their shipped names, so it works wherever it is
written; an existing file is never overwritten.

Examples:
  detr-peg configs list
  detr-peg configs copy detr_r50_peg                # -> ./detr_r50_peg.yaml
  detr-peg configs copy demo my_demo.yaml
  detr-peg train --config my_demo.yaml --print-config
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import yaml

#: The command lists and copies files: it needs neither torch nor the models.
NEEDS_MODELS = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="the shipped configs: name and first line of their description")
    copy = actions.add_parser("copy", help="copy a shipped config out for editing (never overwrites)")
    copy.add_argument("name", metavar="NAME", help="a shipped config, as `detr-peg configs list` names it")
    copy.add_argument("dest", metavar="DEST", nargs="?",
                      help="file or existing folder to write (default: ./NAME's file name)")  # fmt: skip


def description(path: Path) -> str:
    """The first comment line of a config file (its one-line description), or ``""``."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
        if line.strip():
            break
    return ""


def list_configs() -> int:
    from detr_peg.config.shipped import shipped_config, shipped_configs_dir, shipped_names

    names = shipped_names()
    root = shipped_configs_dir()
    print(f"{len(names)} shipped configs in {root} (--config NAME uses one; detr-peg configs copy NAME edits a copy):")
    width = max((len(n) for n in names), default=0)
    for name in names:
        path = shipped_config(name)
        print(f"  {name:<{width}}  {description(path) if path else ''}".rstrip())
    return 0


def copy_config(name: str, dest: str | None) -> int:
    from detr_peg.config.shipped import portable_text, require_shipped
    from detr_peg.errors import UserError
    from detr_peg.outputs import atomic_write_text

    source = require_shipped(name)
    target = Path(dest) if dest else Path(source.name)
    if target.is_dir() or (dest or "").endswith(("/", os.sep)):  # a folder, named by its slash
        target = target / source.name
    files = {target: portable_text(source)}
    # A detectron2 config reads its `_BASE_` file from its own folder: the parent comes along.
    parent = (yaml.safe_load(source.read_text(encoding="utf-8")) or {}).get("_BASE_")
    if isinstance(parent, str) and (source.parent / parent).is_file():
        files[target.parent / parent] = (source.parent / parent).read_text(encoding="utf-8")
    existing = [path for path in files if path.exists() or path.is_symlink()]
    if existing:
        raise UserError(
            f"{existing[0]} already exists and is not overwritten; give another DEST or move the file away first."
        )
    if not target.parent.is_dir():
        raise UserError(f"The folder {target.parent} of DEST does not exist; create it or give another DEST.")
    for path, text in files.items():
        atomic_write_text(path, text)
        print(f"configs: wrote {path}")
    if name.replace("\\", "/").removeprefix("configs/").startswith("detectron2/"):
        print(f"configs: use it with python tools/train_detectron2.py --config-file {target}")
    elif "configs" in (yaml.safe_load(files[target]) or {}):
        print(f"configs: use it with detr-peg study --study {target}")
    else:
        print(f"configs: use it with --config {target}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        return list_configs()
    return copy_config(args.name, args.dest)
