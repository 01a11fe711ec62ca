"""Waits that explain themselves: what each open batch of a worker waits for.

A batch closes when every producer's marker arrived, else by timeout; a merge is
published when every partition's partial arrived, else by timeout. A wait that
nobody explains looks like a hang, then like a plausible ``timeout`` batch 60 s
later. Pure: the stages' ``waiting()`` lists in, the stats page's view and the log
lines out; ``WaitReporter`` says each wait once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..core.stage1 import Waiting, shorten
from ..core.stage2 import MergeWaiting

__all__ = ["BatchWait", "WaitReporter", "merge_waits", "stage1_waits"]

#: a merge that waited this long for other partitions' partials is said in the log
MERGE_REPORT_AFTER_MS = 5_000
#: a batch with some producers' markers is said once its input stopped this long: most close
#: within milliseconds, as the other markers arrive (issue 39.4: nearly every batch logged
#: "waiting for 3 more ... 60 s" and closed 40 ms later)
MARKERS_REPORT_AFTER_MS = 1_000


@dataclass(slots=True)
class BatchWait:
    """One batch open on some of this worker's partitions, all of them put together."""

    run_id: str | None
    batch_id: str
    partitions: list[int] = field(default_factory=list)
    marker_producers: set[str] = field(default_factory=set)
    expected_producers: int = 0
    idle_ms: int = 0
    closes_in_ms: int = 0

    def add(self, partition: int, w: Waiting) -> None:
        """One more partition's wait of the batch: markers go to every partition, so their
        union is what arrived; it waits as long as its least idle partition, and closes
        by timeout on its last."""
        self.partitions.append(partition)
        self.marker_producers |= w.marker_producers
        self.expected_producers = max(self.expected_producers, w.expected_producers)
        self.idle_ms = min(self.idle_ms, w.idle_ms)
        self.closes_in_ms = max(self.closes_in_ms, w.closes_in_ms)

    @property
    def waiting_for(self) -> str:
        name = _name(self.run_id, self.batch_id)
        closes = f"closes by timeout in {self.closes_in_ms / 1000:.0f} s"
        if self.expected_producers == 0:
            return (
                f"{name}: no producer's marker yet (a publisher's close_batch sends one to every partition); "
                f"{closes} after its last input"
            )
        left = self.expected_producers - len(self.marker_producers)
        arrived = ", ".join(sorted(self.marker_producers)[:5]) + ("..." if len(self.marker_producers) > 5 else "")
        return (
            f"{name}: markers from {len(self.marker_producers)} of {self.expected_producers} producers ({arrived}); "
            f"waiting for {left} more, or it {closes} (expected_producers={self.expected_producers} in close_batch "
            f"must be the number of publishers that close it)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "batch_id": self.batch_id,
            "partitions": self.partitions,
            "markers_from": sorted(self.marker_producers),
            "expected_producers": self.expected_producers,
            "idle_s": round(self.idle_ms / 1000, 1),
            "closes_by_timeout_in_s": round(self.closes_in_ms / 1000, 1),
            "waiting_for": self.waiting_for,
        }


def stage1_waits(by_partition: Iterable[tuple[int, Iterable[Waiting]]]) -> list[BatchWait]:
    """The open batches of every partition of this worker, a batch's partitions put together:
    markers go to every partition, so their union is what arrived; the batch closes on its
    last partition by timeout last."""
    batches: dict[tuple[str | None, str], BatchWait] = {}
    for partition, waits in by_partition:
        for w in waits:
            batch = batches.setdefault((w.run_id, w.batch_id), BatchWait(w.run_id, w.batch_id, idle_ms=w.idle_ms))
            batch.add(partition, w)
    return sorted(batches.values(), key=lambda b: (b.run_id or "", b.batch_id))


def merge_waits(waits: Iterable[MergeWaiting]) -> list[dict[str, Any]]:
    """The merges of this worker waiting for partials, for the stats page."""
    return [
        {
            "run_id": w.run_id,
            "batch_id": w.batch_id,
            "partitions_reported": list(w.partitions_reported),
            "partitions_expected": w.partitions_expected,
            "publishes_by_timeout_in_s": round(w.publishes_in_ms / 1000, 1),
            "waiting_for": _merge_line(w),
        }
        for w in sorted(waits, key=lambda w: (w.run_id or "", w.batch_id))
    ]


def _merge_line(w: MergeWaiting) -> str:
    missing = sorted(set(range(w.partitions_expected)) - set(w.partitions_reported))
    shown = ", ".join(map(str, missing[:8])) + ("..." if len(missing) > 8 else "")
    return (
        f"{_name(w.run_id, w.batch_id)}: partials from {len(w.partitions_reported)} of {w.partitions_expected} "
        f"records partitions; waiting for partition(s) {shown} (closed there by markers or timeout, on whichever "
        f"worker owns them), or it is published incomplete by timeout in {w.publishes_in_ms / 1000:.0f} s"
    )


def _name(run_id: str | None, batch_id: str) -> str:
    return f"batch {shorten(batch_id)}" + ("" if run_id is None else f" of run {shorten(run_id)}")


@dataclass
class WaitReporter:
    """Says each wait once: a batch when some markers arrived but not all and its input
    stopped for ``MARKERS_REPORT_AFTER_MS`` (or when no marker came and its input stopped
    for half the timeout), a merge when it waited ``MERGE_REPORT_AFTER_MS`` for other
    partitions' partials."""

    batch_timeout_ms: int
    _said: set[tuple[str, str | None, str]] = field(default_factory=set)

    def lines(self, batches: list[BatchWait], merges: Iterable[MergeWaiting]) -> list[str]:
        waiting: set[tuple[str, str | None, str]] = set()
        out = self._batch_lines(batches, waiting) + self._merge_lines(merges, waiting)
        self._said = waiting  # a wait that ended may be said again if it comes back
        return out

    def _batch_lines(self, batches: list[BatchWait], waiting: set[tuple[str, str | None, str]]) -> list[str]:
        """The lines of the batches that wait now and were not said (their waits into ``waiting``)."""
        out = []
        for b in batches:
            kind = self._kind(b)
            if kind is None:
                continue
            key = (kind, b.run_id, b.batch_id)
            waiting.add(key)
            if key not in self._said:
                out.append(b.waiting_for)
        return out

    def _kind(self, b: BatchWait) -> str | None:
        """What a batch waits for: ``markers`` (some arrived, not all), ``stalled`` (none
        came and its input stopped for half the timeout), or None (nothing to say)."""
        incomplete = 0 < len(b.marker_producers) < b.expected_producers and b.idle_ms >= MARKERS_REPORT_AFTER_MS
        stalled = b.expected_producers == 0 and b.idle_ms >= self.batch_timeout_ms // 2
        return "markers" if incomplete else "stalled" if stalled else None

    def _merge_lines(self, merges: Iterable[MergeWaiting], waiting: set[tuple[str, str | None, str]]) -> list[str]:
        """The lines of the merges that waited long enough and were not said (their waits
        into ``waiting``)."""
        out = []
        for m in merges:
            if m.waited_ms < MERGE_REPORT_AFTER_MS:
                continue
            key = ("merge", m.run_id, m.batch_id)
            waiting.add(key)
            if key not in self._said:
                out.append(_merge_line(m))
        return out
