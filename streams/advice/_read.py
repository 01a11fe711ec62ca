"""Published metrics from bytes: JSON lines (``specmeter aggregate --format jsonl``,
``tail --json``) or one JSON list (``aggregate --format json``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec

from specmeter.schemas import BatchMetrics, decode_metrics

from ._model import AdviceError

__all__ = ["metrics_from_lines"]


def metrics_from_lines(lines: Iterable[bytes], name: str = "the input") -> Iterator[BatchMetrics]:
    """BatchMetrics from JSON lines (``specmeter aggregate --format jsonl``, ``tail --json``)
    or one JSON list (``aggregate --format json``); blank lines are skipped.

    Raises:
        AdviceError: a line (or the document) is not BatchMetrics JSON, with its number.
    """
    it = iter(lines)
    for number, line in enumerate(it, start=1):
        text = line.strip()
        if not text:
            continue
        if text.startswith(b"["):  # one JSON document: the rest of the input belongs to it
            yield from _document(b"".join([line, *it]), name, number)
            return
        yield _line(text, name, number)


def _line(text: bytes, name: str, number: int) -> BatchMetrics:
    """The BatchMetrics of line ``number``."""
    try:
        return decode_metrics(text)
    except msgspec.DecodeError as exc:
        raise _not_metrics(name, f"line {number}", exc) from None


def _document(document: bytes, name: str, number: int) -> list[BatchMetrics]:
    """The BatchMetrics of one JSON list that starts at line ``number``."""
    try:
        return msgspec.json.decode(document, type=list[BatchMetrics])
    except msgspec.DecodeError as exc:  # a ValidationError is one too
        raise _not_metrics(name, f"the JSON list from line {number}", exc) from None


def _not_metrics(name: str, where: str, exc: Exception) -> AdviceError:
    return AdviceError(
        f"{name}, {where}, is not a BatchMetrics JSON object ({exc})",
        "advise reads published metrics: `specmeter aggregate --format jsonl DUMP` or `specmeter tail --json` "
        "output, not a records dump",
    )
