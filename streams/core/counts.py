"""The worker's own counts: every input accounted for, exactly once.

The stages count into one ``WorkerCounters`` as they apply input (each record is
exactly one of aggregated, redelivered, late or dead-lettered); the shell adds what
only it sees (close latency, the garbage collector's pauses). Pure: ``report`` exports
them to Prometheus.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["WorkerCounters", "CLOSE_LATENCY_BUCKETS"]

#: upper bounds (seconds) of the close-latency histogram buckets
CLOSE_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class WorkerCounters:
    """Since this worker process started. Each record is exactly one of aggregated,
    redelivered, late (applied within grace) or dead-lettered."""

    messages: int = 0
    messages_replayed_skipped: int = 0
    records_aggregated: int = 0
    records_redelivered: int = 0
    records_late: int = 0
    records_dead_lettered: int = 0
    records_conflicting: int = 0
    records_invalid: int = 0
    markers: int = 0
    dead_letters: dict[str, int] = field(default_factory=dict)
    partials_emitted: int = 0
    #: a batch closes once on every records partition it has input on: batch × partition, by reason
    batch_partitions_closed: dict[str, int] = field(default_factory=dict)
    batches_published: int = 0
    batches_expired: int = 0
    close_latency_buckets: list[int] = field(default_factory=lambda: [0] * len(CLOSE_LATENCY_BUCKETS))
    close_latency_sum: float = 0.0
    close_latency_count: int = 0
    #: the garbage collector's pauses per generation (0, 1, 2): count, total and longest seconds
    gc_collections: list[int] = field(default_factory=lambda: [0, 0, 0])
    gc_seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    gc_max_seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])

    def observe_close_latency(self, seconds: float) -> None:
        self.close_latency_sum += seconds
        self.close_latency_count += 1
        for i, bound in enumerate(CLOSE_LATENCY_BUCKETS):
            if seconds <= bound:
                self.close_latency_buckets[i] += 1

    def observe_gc(self, generation: int, seconds: float) -> None:
        self.gc_collections[generation] += 1
        self.gc_seconds[generation] += seconds
        self.gc_max_seconds[generation] = max(self.gc_max_seconds[generation], seconds)

    def dead_letter(self, reason: str, records: int = 1) -> None:
        self.dead_letters[reason] = self.dead_letters.get(reason, 0) + 1
        self.records_dead_lettered += records

    def as_dict(self) -> dict:
        return dict(self.__dict__)
