"""Bounded log lines: a worker never writes a message at the size of its input.

Ids are bounded at ingress, but libraries log whole messages on some errors
(Faust's failed-send warning prints the message it could not send). Every
record's text is cut to ``MAX_LOG_CHARS`` whatever logger or handler it goes to.
"""

from __future__ import annotations

import logging

__all__ = ["MAX_LOG_CHARS", "bound_log_lines"]

MAX_LOG_CHARS = 4000


class _BoundedRecord(logging.LogRecord):
    def getMessage(self) -> str:
        text = super().getMessage()
        if len(text) <= MAX_LOG_CHARS:
            return text
        return f"{text[:MAX_LOG_CHARS]}... [{len(text) - MAX_LOG_CHARS} more characters cut]"


def bound_log_lines() -> None:
    """Make every log record of this process bounded (idempotent)."""
    logging.setLogRecordFactory(_BoundedRecord)
