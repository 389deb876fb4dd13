"""Exceptions meant for users: a :class:`UserError` is one sentence naming what is wrong (CLI: exit 2, no traceback)."""

from __future__ import annotations


class UserError(Exception):
    """Base class of errors caused by user input, reported without a traceback."""


class ConfigError(UserError, ValueError):
    """An invalid config file, config key, value or registry name."""


class DataError(UserError):
    """An invalid dataset: annotation file, image file or sample."""


class DamagedFileError(UserError):
    """A file detr_peg wrote and reads back (a study's plan, a cell's state) that was changed or cut short."""


class CheckpointError(UserError):
    """A checkpoint that is missing, unreadable, unsafe or does not fit the model."""


class TrainingError(UserError):
    """Training cannot go on (non-finite loss, unwritable output folder, full disk)."""


class OutputError(UserError):
    """A file or folder that cannot be written (permissions, a name too long, a full disk, a file in the way)."""


class Terminated(BaseException):
    """SIGTERM outside a training loop, or a second one inside; a ``BaseException``, as KeyboardInterrupt is."""
