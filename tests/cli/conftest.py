"""Fixtures of the command-line tests (shared with the engine tests)."""

from tests.engine.conftest import one_torch_thread  # noqa: F401  (autouse: single-threaded torch)
