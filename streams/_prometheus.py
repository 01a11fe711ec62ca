"""The worker's Prometheus exposition, built at scrape time from its own state.

Naming follows Prometheus conventions: ``specmeter_`` prefix, ``_total`` for
counters, base units (seconds, ratios), no session or generation labels. The
latest published batch is exported as unlabelled gauges plus one info series.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily

from ._counters import CLOSE_LATENCY_BUCKETS

__all__ = ["WorkerCollector", "render", "CLOSE_LATENCY_BUCKETS", "EXPORTED_METRICS"]


#: batch gauge -> key of BatchMetrics.metrics
_BATCH_GAUGES = {
    "specmeter_batch_accept_rate_ratio": ("spec/accept_rate", "Accepted / proposed draft tokens (paired) of the latest batch."),
    "specmeter_batch_tokens_per_verify": ("spec/tokens_per_verify", "Completion tokens per verify step (paired) of the latest batch."),
    "specmeter_batch_accept_coverage_ratio": ("spec/accept_count_coverage", "Share of generations with both accepted and proposed known."),
    "specmeter_batch_verify_coverage_ratio": ("spec/verify_count_coverage", "Share of generations with both completion and verify known."),
    "specmeter_batch_generations": ("spec/unique_generation_count", "Distinct generations of the latest batch."),
    "specmeter_batch_conflicting_generations": ("spec/conflicting_generation_count", "Generations reported with different values."),
    "specmeter_batch_samples": ("spec/sample_count", "Samples (trajectories) of the latest batch."),
    "specmeter_batch_paired_accepted_tokens": ("spec/paired_accepted_total", "Accepted draft tokens over generations with a complete accept pair."),
    "specmeter_batch_paired_proposed_tokens": ("spec/paired_proposed_total", "Proposed draft tokens over generations with a complete accept pair."),
    "specmeter_batch_paired_completion_tokens": ("spec/paired_completion_total", "Completion tokens over generations with a complete verify pair."),
    "specmeter_batch_paired_verify_steps": ("spec/paired_verify_total", "Verify steps over generations with a complete verify pair."),
}

EXPORTED_METRICS = (
    *_BATCH_GAUGES,
    "specmeter_batch_records", "specmeter_batch_invalid_records", "specmeter_batch_missing_records",
    "specmeter_batch_late_records", "specmeter_batch_revision", "specmeter_batch_complete",
    "specmeter_batch_closed_timestamp_seconds", "specmeter_batch_acceptance_length_steps", "specmeter_batch_info",
    "specmeter_messages_total", "specmeter_messages_replayed_skipped_total", "specmeter_records_aggregated_total",
    "specmeter_records_redelivered_total", "specmeter_records_late_total", "specmeter_records_dead_lettered_total",
    "specmeter_records_conflicting_total", "specmeter_records_invalid_total", "specmeter_markers_total",
    "specmeter_dead_letters_total", "specmeter_partials_emitted_total", "specmeter_batches_closed_total",
    "specmeter_batches_published_total", "specmeter_batches_expired_total", "specmeter_offset_gap_fills_total", "specmeter_idle_catch_ups_total",
    "specmeter_open_generations", "specmeter_partition_seconds_since_last_event",
    "specmeter_batch_close_latency_seconds",
)


class WorkerCollector:
    """A prometheus_client collector reading the shell at scrape time."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def collect(self) -> Iterator[Any]:
        shell = self.shell
        c = shell.counters
        for name, value, doc in (
            ("specmeter_messages", c.messages, "Records-topic messages applied."),
            ("specmeter_messages_replayed_skipped", c.messages_replayed_skipped,
             "Messages skipped because the durable state already holds them (redelivery after a crash or rebalance)."),
            ("specmeter_records_aggregated", c.records_aggregated, "Records that added a new occurrence."),
            ("specmeter_records_redelivered", c.records_redelivered, "Records whose occurrence was already known."),
            ("specmeter_records_late", c.records_late, "Records applied to a closed batch within its grace period."),
            ("specmeter_records_dead_lettered", c.records_dead_lettered, "Records sent to the dead-letter topic."),
            ("specmeter_records_conflicting", c.records_conflicting, "Records whose value contradicts an earlier delivery."),
            ("specmeter_records_invalid", c.records_invalid, "Records that failed validation."),
            ("specmeter_markers", c.markers, "Batch markers received."),
            ("specmeter_partials_emitted", c.partials_emitted, "Per-partition partial aggregates emitted."),
            ("specmeter_batches_published", c.batches_published, "BatchMetrics messages published (all revisions)."),
            ("specmeter_batches_expired", c.batches_expired, "Batches forgotten after their grace period."),
            ("specmeter_offset_gap_fills", shell.gap_fills,
             "Times offsets skipped by the consumer were read directly to keep the state exact."),
            ("specmeter_idle_catch_ups", shell.idle_catch_ups,
             "Times a partition with unread messages and no delivery was read directly."),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        dead = CounterMetricFamily("specmeter_dead_letters", "Dead letters by reason.", labels=["reason"])
        for reason, n in sorted(c.dead_letters.items()):
            dead.add_metric([reason], n)
        yield dead
        closed = CounterMetricFamily("specmeter_batches_closed", "Batch partitions closed, by reason.", labels=["reason"])
        for reason, n in sorted(c.batches_closed.items()):
            closed.add_metric([reason], n)
        yield closed
        yield GaugeMetricFamily("specmeter_open_generations", "Distinct generations held in dedup state.",
                                value=sum(p.open_generations for p in shell.processors.values()))
        idle = GaugeMetricFamily("specmeter_partition_seconds_since_last_event",
                                 "Seconds since the last records-topic message of each owned partition.",
                                 labels=["partition"])
        now = time.time()
        for partition in sorted(shell.processors):
            idle.add_metric([str(partition)], now - shell.last_event_at.get(partition, shell.started_at))
        yield idle
        latency = HistogramMetricFamily("specmeter_batch_close_latency_seconds",
                                        "From a batch's close on its partitions to its publication.")
        buckets = [(str(b), n) for b, n in zip(CLOSE_LATENCY_BUCKETS, c.close_latency_buckets)]
        latency.add_metric([], buckets + [("+Inf", c.close_latency_count)], c.close_latency_sum)
        yield latency
        m = shell.last_published
        if m is None:
            return
        for name, (key, doc) in _BATCH_GAUGES.items():
            value = m.metrics.get(key)
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=value)
        for name, value, doc in (
            ("specmeter_batch_records", m.record_count, "Records delivered for the latest batch (all deliveries)."),
            ("specmeter_batch_invalid_records", m.invalid_record_count, "Invalid records of the latest batch."),
            ("specmeter_batch_missing_records", m.missing_record_count, "Records markers counted that never arrived."),
            ("specmeter_batch_late_records", m.late_record_count, "Late records of the latest batch."),
            ("specmeter_batch_revision", m.revision, "Revision of the latest publication."),
            ("specmeter_batch_complete", int(m.complete), "1 when the latest batch is complete."),
            ("specmeter_batch_closed_timestamp_seconds", m.closed_at, "When the latest batch closed."),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
        histogram = GaugeMetricFamily("specmeter_batch_acceptance_length_steps",
                                      "Verify steps of the latest batch that accepted N drafts.", labels=["accepted"])
        for accepted, steps in enumerate(m.accept_histogram or ()):
            histogram.add_metric([str(accepted)], steps)
        yield histogram
        info = InfoMetricFamily("specmeter_batch", "Identity of the latest published batch.")
        info.add_metric([], {"batch_id": m.batch_id, "speculative_algorithm": m.speculative_algorithm or "",
                             "close_reason": m.close_reason})
        yield info


def render(shell: Any) -> bytes:
    """The text exposition format of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(shell))
    return generate_latest(registry)
