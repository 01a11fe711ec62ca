"""Offline aggregation of a JSON-lines rollout dump: the same core as the stream.

Lines are records or markers (``"type": "marker"``). Batches ``(run_id, batch_id)``
are reported in order of first appearance, each as one partition that saw it all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from specmeter.schemas import BatchMarker, BatchMetrics, GenerationRecord, InvalidRecord, decode_json_line

from .merge import build_batch_metrics
from .state import BatchState

__all__ = ["OfflineAggregator", "LineError"]


@dataclass(frozen=True, slots=True)
class LineError:
    """A line that could not be used, and why (reported, never fatal)."""

    line_number: int
    reason: str
    detail: str
    batch_id: str | None
    run_id: str | None = None

    def __str__(self) -> str:
        if self.batch_id is None:
            where = "no readable batch identity: counted nowhere"
        elif self.run_id is None:
            where = f"batch {_short(self.batch_id)}"
        else:
            where = f"batch {_short(self.batch_id)} of run {_short(self.run_id)}"
        return f"line {self.line_number}: {self.reason}: {self.detail} ({where})"


def _short(value: str, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(value)} chars)"


@dataclass
class OfflineAggregator:
    """Feeds dump lines to one ``BatchState`` per batch and builds their metrics.

    Args:
        speculative_algorithm: applied to every batch, as if each had a marker naming it.
        on_error: called with each bad line (the CLI prints it on stderr).
    """

    speculative_algorithm: str | None = None
    on_error: Callable[[LineError], None] | None = None
    #: line parser; the CLI passes the producers' dump parser (it also reads SGLang outputs)
    parse: Callable[[bytes | str], GenerationRecord | BatchMarker | InvalidRecord] = decode_json_line
    #: by batch identity (run_id, batch_id)
    batches: dict[tuple[str | None, str], BatchState] = field(default_factory=dict)
    #: lines that could not be used (reported through ``on_error``)
    errors: int = 0
    #: lines that were a valid record or marker
    read: int = 0

    def _state(self, run_id: str | None, batch_id: str) -> BatchState:
        state = self.batches.get((run_id, batch_id))
        if state is None:
            state = self.batches[(run_id, batch_id)] = BatchState(batch_id, run_id)
            if self.speculative_algorithm:
                state.add_algorithm(self.speculative_algorithm)
        return state

    def feed_line(self, line: bytes | str, line_number: int) -> None:
        """Apply one line; blank lines are skipped."""
        if not line.strip():
            return
        self.feed(self.parse(line), line_number)

    def feed(self, item: GenerationRecord | BatchMarker | InvalidRecord, line_number: int = 0) -> None:
        if isinstance(item, GenerationRecord):
            self.read += 1
            self._state(item.run_id, item.batch_id).add(item)
        elif isinstance(item, BatchMarker):
            self.read += 1
            self._state(item.run_id, item.batch_id).add_marker(item)
        else:
            self.errors += 1
            if item.batch_id is not None:
                self._state(item.run_id, item.batch_id).add_invalid(item.producer_id)
            if self.on_error is not None:
                self.on_error(LineError(line_number, item.reason, item.detail, item.batch_id, item.run_id))

    def feed_lines(self, lines: Iterable[bytes | str]) -> None:
        for number, line in enumerate(lines, start=1):
            self.feed_line(line, number)

    def results(self, *, closed_at: float | None = None) -> list[BatchMetrics]:
        """One ``BatchMetrics`` per batch, in order of first appearance."""
        now = time.time() if closed_at is None else closed_at
        out = []
        for state in self.batches.values():
            reason = "markers" if state.markers_complete else "end_of_input"
            partial = state.partial(partition=0, close_reason=reason, closed_at_ms=int(now * 1000))
            out.append(
                build_batch_metrics([partial], revision=0, close_reason=reason, closed_at=now, partitions_expected=1)
            )
        return out
