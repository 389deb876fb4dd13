"""Dispatch a ``detr-peg convert`` source to the official or the Transformers converter."""

from __future__ import annotations

import os
from typing import Any

from detr_peg.convert.official import convert_official
from detr_peg.convert.report import ConversionReport, save_report
from detr_peg.convert.source_kind import is_transformers_source
from detr_peg.convert.transformers_folder import convert_transformers


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
