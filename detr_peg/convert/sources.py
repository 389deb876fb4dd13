"""Which converter reads a ``detr-peg convert`` source: an official checkpoint file or a Transformers folder.

A folder, or a Hugging Face Hub name (``owner/name``) that is not a local
path, is a Transformers checkpoint (:mod:`detr_peg.convert.transformers_folder`);
anything else is an official DETR or Deformable-DETR checkpoint file or URL
(:mod:`detr_peg.convert.official`).
"""

from __future__ import annotations

import os
from typing import Any

from detr_peg.convert.official import convert_official
from detr_peg.convert.report import ConversionReport, save_report
from detr_peg.convert.transformers_folder import convert_transformers
from detr_peg.fileio.hub_files import is_hub_name


def is_transformers_source(src: str | os.PathLike) -> bool:
    """Whether ``src`` is read as a Transformers checkpoint: a local folder, or a Hub name."""
    return os.path.isdir(src) or is_hub_name(str(src))


def convert_checkpoint(src: str | os.PathLike, **kwargs: Any) -> ConversionReport:
    """Convert ``src`` in memory with the converter its kind needs (keyword arguments as theirs)."""
    if is_transformers_source(src):
        return convert_transformers(src, **kwargs)
    return convert_official(src, **kwargs)


def convert_file(src: str | os.PathLike, dst: str | os.PathLike, **kwargs: Any) -> ConversionReport:
    """:func:`convert_checkpoint`, then write the detr_peg checkpoint ``dst`` atomically."""
    report = convert_checkpoint(src, **kwargs)
    save_report(report, src, dst)
    return report
