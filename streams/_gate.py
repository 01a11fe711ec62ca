"""Admitting only contiguous offsets after a durable checkpoint.

Faust's consumer can, around rebalances, deliver prefetched messages out of
order, skip offsets, and commit past offsets that were never acknowledged
(faust-streaming#216, #221, #312). Our durable checkpoint, not Faust's
committed offset, says what was applied; this gate lets through only the
offsets that follow it, and asks for a seek back when a gap shows up. A gap
that survives several seeks is real (transaction markers, compaction) and is
accepted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OffsetGate"]

log = logging.getLogger("specmeter.gate")


@dataclass
class OffsetGate:
    """Per-partition contiguity check; pure (times come in)."""

    retry_after_s: float = 1.0
    accept_after: int = 3
    _sought: dict[int, tuple[int, float, int]] = field(default_factory=dict)

    def admit(self, partition: int, checkpoint: int, messages: list[tuple[int, Any]],
              now_s: float) -> tuple[list[tuple[int, Any]], int | None]:
        """Split ``messages`` (sorted by offset) into those to apply now and an
        offset to seek to (None: no seek needed)."""
        expected = checkpoint + 1
        admitted: list[tuple[int, Any]] = []
        gap_at = None
        for index, (offset, value) in enumerate(messages):
            if offset < expected:
                continue  # applied before: a redelivery
            if offset != expected:
                gap_at = index
                break
            admitted.append((offset, value))
            expected += 1
        if gap_at is None:
            self._sought.pop(partition, None)
            return admitted, None
        last = self._sought.get(partition)
        attempts = last[2] if last is not None and last[0] == expected else 0
        if last is not None and last[0] == expected and now_s - last[1] < self.retry_after_s:
            return admitted, None  # a seek is under way; drop what came past the gap
        if attempts >= self.accept_after:
            log.warning("partition=%d offsets %d..%d never arrived after %d seeks: accepting the gap",
                        partition, expected, messages[gap_at][0] - 1, attempts)
            self._sought.pop(partition, None)
            rest = [m for m in messages[gap_at:]]
            return admitted + self._contiguous(rest), None
        self._sought[partition] = (expected, now_s, attempts + 1)
        log.warning("partition=%d got offset %d but expects %d (durable checkpoint): seeking back",
                    partition, messages[gap_at][0], expected)
        return admitted, expected

    @staticmethod
    def _contiguous(messages: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
        out = messages[:1]
        for offset, value in messages[1:]:
            if offset != out[-1][0] + 1:
                break
            out.append((offset, value))
        return out

    def forget(self, partition: int) -> None:
        self._sought.pop(partition, None)
