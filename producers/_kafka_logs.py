"""aiokafka's lines about a broker it cannot reach, kept while a client connects and said
as a person says them: the publisher's ``start`` and the commands' checks before they
start end with one line of their own, not aiokafka's raw ``Unable connect to ...`` beside
it (issue 47.7). Here, in the producer library, because the stream side imports it and
never the other way round."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["quiet_kafka_logs", "connection_reason"]


class _Tap(logging.Handler):
    """Keeps aiokafka's connection errors instead of printing them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.messages.append(record.getMessage())
        except Exception:  # noqa: BLE001 - a bad log call must not hide the real error
            pass


@contextmanager
def quiet_kafka_logs() -> Iterator[list[str]]:
    """aiokafka's log lines while the block runs, collected instead of printed (every
    client's in this process: keep the block to a connection attempt)."""
    logger = logging.getLogger("aiokafka")
    tap = _Tap()
    propagate = logger.propagate
    logger.addHandler(tap)
    logger.propagate = False
    try:
        yield tap.messages
    finally:
        logger.removeHandler(tap)
        logger.propagate = propagate


def connection_reason(messages: list[str]) -> str:
    """aiokafka's connection errors, as a person says them ("connection refused", "unknown
    host", "timed out"), else the last line it logged, cut to 160 characters."""
    text = " ".join(messages)
    for needle, said in (
        ("Connect call failed", "connection refused"),
        ("Connection refused", "connection refused"),
        ("Name or service not known", "unknown host"),
        ("nodename nor servname", "unknown host"),
        ("Temporary failure in name resolution", "unknown host"),
        ("timed out", "timed out"),
        ("TimeoutError", "timed out"),
    ):
        if needle in text:
            return said
    last = messages[-1] if messages else "no answer"
    return last if len(last) <= 160 else last[:157] + "..."
