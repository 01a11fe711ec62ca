"""Capturing what a logger says, for tests of log lines (outages, dead letters)."""

from __future__ import annotations

import logging
import time


class Lines(logging.Handler):
    """Keeps (level, message) of every record it is given."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))


def private_logger(prefix: str = "test") -> tuple[logging.Logger, list[tuple[int, str]]]:
    """A logger of the test's own (nothing propagates) and the (level, message) list it fills."""
    logger = logging.getLogger(f"{prefix}-{time.monotonic_ns()}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    lines = Lines()
    logger.addHandler(lines)
    return logger, lines.lines
