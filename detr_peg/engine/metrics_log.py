"""What a run reports: ``metrics.jsonl`` (one JSON record per line), console lines, progress bars, TensorBoard.

Records have a ``type`` (``start``, ``iter``, ``epoch``, ``eval``, ``end``) and ``time``; a resumed run appends.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from detr_peg.errors import ConfigError, TrainingError
from detr_peg.messages import install_hint
from detr_peg.outputs import write_error

METRICS_FILE = "metrics.jsonl"
FLOAT32_MAX = 3.4028234663852886e38


def log_records(metrics_jsonl: Path, *, missing_ok: bool = True) -> Iterator[dict[str, Any]]:
    """The JSON objects of a run's ``metrics.jsonl`` in order; lines that are not JSON objects are passed over.

    ``missing_ok``: an unreadable log gives no record; with False the ``OSError``/``UnicodeDecodeError`` is raised.
    """
    try:
        lines = metrics_jsonl.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        if missing_ok:
            return
        raise
    for line in lines:
        try:
            record = json.loads(line, parse_float=_number, parse_int=_number)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            yield record


def _number(text: str) -> float | int:
    """A number of a log line; NaN, which readers pass over, beyond what a run writes (float32, int64) as plots
    and sums would overflow."""
    value = float(text) if any(c in text for c in ".eE") else int(text)
    inside = abs(value) <= FLOAT32_MAX if isinstance(value, float) else -(2**63) <= value < 2**63
    return value if inside else math.nan


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (``?`` when unknown)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/Infinity
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


logger = logging.getLogger(__name__)


class MetricsLog:
    """The main process's reporting into ``<output_dir>/metrics.jsonl`` and ``<output_dir>/tensorboard``.

    Raises:
        ConfigError: ``tensorboard`` asked for but not installed.
        TrainingError: ``metrics.jsonl`` cannot be opened.
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        tensorboard: bool = False,
        progress_bars: bool | None = None,
        jsonl: bool = True,
        append: bool = True,
    ) -> None:
        self.path = Path(output_dir) / METRICS_FILE
        self._file = None
        if jsonl:
            try:
                self._file = open(self.path, "a" if append else "w", encoding="utf-8")
            except OSError as exc:
                raise write_error(self.path, exc, "open") from None
        self.progress_bars = (
            bool(sys.stderr and sys.stderr.isatty()) if progress_bars is None else progress_bars
        )  # None: closed
        self._bar = None
        self._writer = None
        if tensorboard:
            try:
                # An optional dependency (the `tensorboard` extra): imported only when asked for.
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self.close()
                raise ConfigError(
                    f"train.tensorboard=true needs the tensorboard package: {install_hint('tensorboard')}."
                ) from None
            self._writer = SummaryWriter(log_dir=str(Path(output_dir) / "tensorboard"))

    # ------------------------------------------------------------ records

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (flushed at once, so a killed run keeps its log)."""
        record = {**record, "time": round(time.time(), 3)}
        if self._file is not None:
            try:
                self._file.write(json.dumps(_jsonable(record)) + "\n")
                self._file.flush()
            except OSError as exc:
                raise TrainingError(
                    f"Could not write {self.path}: {exc.strerror or exc}; the last checkpoint is intact."
                ) from None
        if self._writer is not None:
            step = record.get("iteration", 0)
            kind = record.get("type", "misc")
            for key, value in record.items():
                if key in ("time", "iteration", "type") or isinstance(value, bool):
                    continue
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(f"{kind}/{key}", value, step)
            self._writer.flush()

    # ------------------------------------------------------------ console

    def info(self, text: str) -> None:
        """A message, through the ``detr_peg`` logger (the command line shows it above any progress bar)."""
        logger.info(text)

    def line(self, text: str) -> None:
        """A periodic progress line, logged only when no bar is shown."""
        if self._bar is None:
            logger.info(text)

    def progress(self, *, total: int, initial: int = 0, desc: str = ""):
        """A progress bar for one loop, or None when bars are off."""
        if not self.progress_bars:
            return None
        self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, leave=False)
        return self._bar

    def step(self, bar, **postfix: float) -> None:
        """Advance ``bar`` by one and show ``postfix`` values."""
        if bar is None:
            return
        bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)
        bar.update(1)

    def close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def close(self) -> None:
        """Close the bar, the file and the TensorBoard writer."""
        self.close_bar()
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
