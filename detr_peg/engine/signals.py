"""Stopping a training run cleanly on SIGINT or SIGTERM.

While :class:`StopRequest` is active, the first SIGINT (Ctrl-C) or SIGTERM
(``kill``, a cluster scheduler, ``torchrun`` shutting down) only sets a flag.
The training loop checks it after every iteration; the runner then writes a
checkpoint and raises :class:`TrainingInterrupted`, which the command line
prints as one line and turns into exit status ``128 + signal number`` (130 for
SIGINT, 143 for SIGTERM). A second signal interrupts at once
(``KeyboardInterrupt``); the checkpoint on disk is then the previous one,
still complete because every write is atomic.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

from detr_peg.errors import TrainingError

HANDLED = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(TrainingError):
    """Training stopped on a signal after writing a checkpoint.

    Attributes:
        exit_code: ``128 + signal number``, the shell convention.
    """

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class StopRequest:
    """Context manager that turns the first SIGINT/SIGTERM into a stop request.

    Outside the main thread (where Python cannot install handlers) it does
    nothing and signals keep their usual effect.

    Attributes:
        signum: the signal received, or None.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()
