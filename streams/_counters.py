"""The worker's own counters: every input accounted for, exported to Prometheus."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "WorkerCounters",
    "CLOSE_LATENCY_BUCKETS",
    "PublishedTotals",
    "LabelTotals",
    "PUBLISHED_QUANTITIES",
    "published_labels",
]

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
    batches_closed: dict[str, int] = field(default_factory=dict)
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


#: (counter stem, where in BatchMetrics, help): sums over a batch's distinct generations
#: or its records, so one batch's value adds to another's. ``spec/...`` are keys of
#: ``BatchMetrics.metrics`` (absent, e.g. in a non-speculative batch: 0), ``""`` is 1 per
#: batch, the rest are its attributes.
PUBLISHED_QUANTITIES: tuple[tuple[str, str, str], ...] = (
    ("batches", "", "Distinct batches published (a batch counts once, whatever its revisions)."),
    (
        "paired_accepted_tokens",
        "spec/paired_accepted_total",
        "Accepted draft tokens of generations with both accepted and proposed known.",
    ),
    (
        "paired_proposed_tokens",
        "spec/paired_proposed_total",
        "Proposed draft tokens of generations with both accepted and proposed known.",
    ),
    (
        "paired_completion_tokens",
        "spec/paired_completion_total",
        "Completion tokens of generations with both completion and verify known.",
    ),
    (
        "paired_verify_steps",
        "spec/paired_verify_total",
        "Verify steps of generations with both completion and verify known.",
    ),
    ("accepted_tokens", "spec/accepted_total", "Accepted draft tokens, every known value."),
    ("proposed_tokens", "spec/proposed_total", "Proposed draft tokens, every known value."),
    ("completion_tokens", "spec/completion_total", "Completion tokens, every known value."),
    ("verify_steps", "spec/verify_total", "Verify steps, every known value."),
    ("accept_covered_generations", "spec/accept_covered_count", "Generations with both accepted and proposed known."),
    ("verify_covered_generations", "spec/verify_covered_count", "Generations with both completion and verify known."),
    ("generations", "spec/unique_generation_count", "Distinct generations."),
    (
        "conflicting_generations",
        "spec/conflicting_generation_count",
        "Generations reported with different values (left out of every sum).",
    ),
    ("published_records", "record_count", "Records delivered (every delivery, invalid ones included)."),
    ("published_invalid_records", "invalid_record_count", "Invalid records attributed to a batch."),
    ("published_late_records", "late_record_count", "Records applied to a batch after it closed, within grace."),
)

#: labels of the counters of published batches: (algorithm, run_id)
Labels = tuple[str, str]
_Vector = tuple[int, ...]


def _vector(metrics: Any) -> _Vector:
    m = metrics.metrics
    return tuple(
        1 if not source else int(m.get(source, 0)) if source.startswith("spec/") else int(getattr(metrics, source))
        for _, source, _ in PUBLISHED_QUANTITIES
    )


def published_labels(metrics: Any) -> Labels:
    """(algorithm, run_id) of a BatchMetrics: the algorithm a marker named (``unknown`` if
    none did), the run id (``""`` for the default run, whose records name none)."""
    return (metrics.speculative_algorithm or "unknown", metrics.run_id or "")


@dataclass
class LabelTotals:
    """One (algorithm, run_id)'s running sums: what revisions added and what later
    revisions took back (a late record that makes a key conflicting removes its
    counters from the batch's sums). Both only grow, as Prometheus counters must."""

    added: list[int] = field(default_factory=lambda: [0] * len(PUBLISHED_QUANTITIES))
    retracted: list[int] = field(default_factory=lambda: [0] * len(PUBLISHED_QUANTITIES))
    #: whether a scrape has seen the label set (the first one shows it at 0, see _prometheus)
    scraped: bool = False


@dataclass
class _Published:
    labels: Labels
    vector: _Vector
    revision: int
    at_s: float


@dataclass
class PublishedTotals:
    """Running sums of every BatchMetrics revision this worker published, for counters
    that add up across batches, revisions and workers.

    A revision adds only its difference from the previous revision of the same
    ``(run_id, batch_id)`` that this worker published (an increase to ``added``, a
    decrease to ``retracted``), so ``added - retracted`` is, per label set, the sum over
    batches of their latest revision. Memory is bounded: a batch is remembered for
    ``forget_after_s`` after its last publication (stage 2 keeps a batch for grace +
    timeout after its last change, so no revision can follow later) and at most
    ``max_remembered`` batches; at most ``max_label_sets`` (algorithm, run_id) pairs
    are kept, the least recently published one dropped first; the last
    ``latest_batches`` batches are kept whole for the latest-batch gauges.
    """

    forget_after_s: float = 360.0
    max_remembered: int = 100_000
    max_label_sets: int = 16
    latest_batches: int = 8
    totals: OrderedDict[Labels, LabelTotals] = field(default_factory=OrderedDict)
    latest: OrderedDict[tuple[str | None, str], Any] = field(default_factory=OrderedDict)
    _last: OrderedDict[tuple[str | None, str], _Published] = field(default_factory=OrderedDict)

    def observe(self, metrics: Any, now_s: float) -> None:
        """Count a published revision (a repeated or older revision counts nothing)."""
        self._remember(metrics, now_s, count=True)

    def seed(self, republished: Iterable[Any], now_s: float) -> None:
        """Remember revisions without counting them: those republished after a partition
        moved here, which their previous owner already counted (later revisions then
        add only their difference, so a rebalance does not count a batch twice)."""
        for metrics in republished:
            self._remember(metrics, now_s, count=False)

    def _label_totals(self, labels: Labels) -> LabelTotals:
        totals = self.totals.get(labels)
        if totals is None:
            totals = self.totals[labels] = LabelTotals()
            while len(self.totals) > self.max_label_sets:
                self.totals.popitem(last=False)
        else:
            self.totals.move_to_end(labels)
        return totals

    def _add(self, labels: Labels, before: _Vector, after: _Vector) -> None:
        totals = self._label_totals(labels)
        for i, (old, new) in enumerate(zip(before, after, strict=True)):
            if new > old:
                totals.added[i] += new - old
            elif new < old:
                totals.retracted[i] += old - new

    def _remember(self, metrics: Any, now_s: float, *, count: bool) -> None:
        key = (metrics.run_id, metrics.batch_id)
        known = self._last.get(key)
        if known is not None and metrics.revision <= known.revision:
            return
        labels, vector = published_labels(metrics), _vector(metrics)
        if count:
            before: _Vector = (0,) * len(vector)
            if known is not None and known.labels != labels:
                # a marker named the algorithm after the first revision: the batch moves
                self._add(known.labels, known.vector, before)
            elif known is not None:
                before = known.vector
            self._add(labels, before, vector)
        self._last[key] = _Published(labels, vector, metrics.revision, now_s)
        self._last.move_to_end(key)
        self._forget(now_s)
        self.latest[key] = metrics
        self.latest.move_to_end(key)
        while len(self.latest) > self.latest_batches:
            self.latest.popitem(last=False)

    def _forget(self, now_s: float) -> None:
        last = self._last
        while last:
            key, oldest = next(iter(last.items()))
            if len(last) <= self.max_remembered and now_s - oldest.at_s <= self.forget_after_s:
                break
            del last[key]
