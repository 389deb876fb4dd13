"""Exceptions meant for users.

Every error a user can cause (a bad config, dataset, checkpoint or path) is a
:class:`UserError`. Its message is one sentence that names the file, field or
value and says what to do. The command line prints it without a traceback and
exits with status 2; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Base class of errors caused by user input, reported without a traceback."""


class ConfigError(UserError, ValueError):
    """An invalid config file, config key, value or registry name."""


class DataError(UserError):
    """An invalid dataset: annotation file, image file or sample."""


class DamagedFileError(UserError):
    """A file detr_peg wrote and reads back (a study's plan, a cell's state) that was changed or cut short since."""


class CheckpointError(UserError):
    """A checkpoint that is missing, unreadable, unsafe or does not fit the model."""


class TrainingError(UserError):
    """Training cannot go on (non-finite loss, unwritable output folder, full disk)."""


class OutputError(UserError):
    """A file or folder that cannot be written (permissions, a name too long, a full disk, a file in the way)."""
