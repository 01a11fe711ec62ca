"""The worker's Prometheus exposition, built at scrape time from its own state.

Naming follows Prometheus conventions: ``specmeter_`` prefix, ``_total`` for
counters, base units (seconds, ratios, tokens, steps), no session or
generation labels. Three kinds of series:

* **Counters of published batches** (``specmeter_paired_accepted_tokens_total`` …,
  labels ``algorithm`` and ``run_id`` only): every BatchMetrics revision this worker
  published adds its difference from the batch's previous revision, so sums and
  rates add up across batches, revisions and workers. What a revision takes back
  (a late record that turns a key conflicting) goes to the ``_retracted_total``
  twin; the exact value is ``total - retracted``::

      (sum(rate(specmeter_paired_accepted_tokens_total[5m]))
         - sum(rate(specmeter_paired_accepted_tokens_retracted_total[5m])))
      / (sum(rate(specmeter_paired_proposed_tokens_total[5m]))
         - sum(rate(specmeter_paired_proposed_tokens_retracted_total[5m])))

  is the fleet-wide weighted accept rate. A new label set is shown at 0 on its
  first scrape and with its value from the next one: Prometheus 2 takes a
  counter's first sample as its start, so a series born at its value would leave
  the run's first batches out of ``rate()`` and ``increase()``. At most ``PublishedTotals.max_label_sets``
  (16) (algorithm, run_id) pairs are exported; no counter has a batch or weight
  version label (unbounded over a run).
* **The latest batches** this worker published (``specmeter_batch_*`` and, per
  policy version, ``specmeter_weight_version_*``), labelled ``run_id``, ``batch_id``,
  ``algorithm`` (and ``weight_version``): only the last ``PublishedTotals.latest_batches`` (8)
  batches, so the label set never grows over a run.
* **The worker itself**: its stage counters, dead letters by reason, the close
  latency histogram, the last event per partition (a timestamp), and the standard
  ``process_*`` / ``python_*`` collectors.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily

from ._counters import CLOSE_LATENCY_BUCKETS, PUBLISHED_QUANTITIES, PublishedTotals, published_labels

__all__ = ["WorkerCollector", "render", "CLOSE_LATENCY_BUCKETS", "EXPORTED_METRICS", "UNKNOWN_VERSION"]

#: the weight_version label of generations whose version is unknown (null)
UNKNOWN_VERSION = "unknown"

#: latest-batch gauge -> (key of BatchMetrics.metrics, help)
_BATCH_GAUGES = {
    "specmeter_batch_accept_rate_ratio": (
        "spec/accept_rate",
        "Accepted / proposed draft tokens (paired) of a latest batch.",
    ),
    "specmeter_batch_tokens_per_verify": (
        "spec/tokens_per_verify",
        "Completion tokens per verify step (paired) of a latest batch.",
    ),
    "specmeter_batch_accept_coverage_ratio": (
        "spec/accept_count_coverage",
        "Share of generations with both accepted and proposed known.",
    ),
    "specmeter_batch_verify_coverage_ratio": (
        "spec/verify_count_coverage",
        "Share of generations with both completion and verify known.",
    ),
    "specmeter_batch_generations": ("spec/unique_generation_count", "Distinct generations of a latest batch."),
    "specmeter_batch_conflicting_generations": (
        "spec/conflicting_generation_count",
        "Generations reported with different values.",
    ),
    "specmeter_batch_samples": ("spec/sample_count", "Samples (trajectories) of a latest batch."),
    "specmeter_batch_paired_accepted_tokens": (
        "spec/paired_accepted_total",
        "Accepted draft tokens over generations with a complete accept pair.",
    ),
    "specmeter_batch_paired_proposed_tokens": (
        "spec/paired_proposed_total",
        "Proposed draft tokens over generations with a complete accept pair.",
    ),
    "specmeter_batch_paired_completion_tokens": (
        "spec/paired_completion_total",
        "Completion tokens over generations with a complete verify pair.",
    ),
    "specmeter_batch_paired_verify_steps": (
        "spec/paired_verify_total",
        "Verify steps over generations with a complete verify pair.",
    ),
}

#: latest-batch gauge -> (BatchMetrics attribute, help)
_BATCH_FIELDS = {
    "specmeter_batch_records": ("record_count", "Records delivered for a latest batch (all deliveries)."),
    "specmeter_batch_invalid_records": ("invalid_record_count", "Invalid records of a latest batch."),
    "specmeter_batch_missing_records": ("missing_record_count", "Records markers counted that never arrived."),
    "specmeter_batch_late_records": ("late_record_count", "Late records of a latest batch."),
    "specmeter_batch_revision": ("revision", "Revision of a latest batch's newest publication."),
    "specmeter_batch_complete": ("complete", "1 when a latest batch is complete."),
    "specmeter_batch_closed_timestamp_seconds": ("closed_at", "When a latest batch closed (Unix seconds)."),
}

#: per-weight-version gauge of the latest batches -> (key of WeightVersionMetrics.metrics, help)
_VERSION_GAUGES = {
    "specmeter_weight_version_accept_rate_ratio": (
        "spec/accept_rate",
        "Accepted / proposed draft tokens (paired) of one policy version in a latest batch.",
    ),
    "specmeter_weight_version_tokens_per_verify": (
        "spec/tokens_per_verify",
        "Completion tokens per verify step (paired) of one policy version in a latest batch.",
    ),
    "specmeter_weight_version_accept_coverage_ratio": (
        "spec/accept_count_coverage",
        "Share of one version's generations with both accepted and proposed known.",
    ),
    "specmeter_weight_version_generations": (
        "spec/unique_generation_count",
        "Distinct generations of one policy version in a latest batch.",
    ),
    "specmeter_weight_version_paired_accepted_tokens": (
        "spec/paired_accepted_total",
        "Accepted draft tokens (paired) of one policy version in a latest batch.",
    ),
    "specmeter_weight_version_paired_proposed_tokens": (
        "spec/paired_proposed_total",
        "Proposed draft tokens (paired) of one policy version in a latest batch.",
    ),
    "specmeter_weight_version_paired_completion_tokens": (
        "spec/paired_completion_total",
        "Completion tokens (paired) of one policy version in a latest batch.",
    ),
    "specmeter_weight_version_paired_verify_steps": (
        "spec/paired_verify_total",
        "Verify steps (paired) of one policy version in a latest batch.",
    ),
}

#: the worker's own counters: (name, WorkerCounters attribute or shell attribute, help)
_WORKER_COUNTERS = (
    ("specmeter_messages", "messages", "Records-topic messages applied."),
    (
        "specmeter_messages_replayed_skipped",
        "messages_replayed_skipped",
        "Messages skipped because the durable state already holds them (redelivery after a crash or rebalance).",
    ),
    ("specmeter_records_aggregated", "records_aggregated", "Records that added a new occurrence."),
    ("specmeter_records_redelivered", "records_redelivered", "Records whose occurrence was already known."),
    ("specmeter_records_late", "records_late", "Records applied to a closed batch within its grace period."),
    ("specmeter_records_dead_lettered", "records_dead_lettered", "Records sent to the dead-letter topic."),
    ("specmeter_records_conflicting", "records_conflicting", "Records whose value contradicts an earlier delivery."),
    ("specmeter_records_invalid", "records_invalid", "Records that failed validation."),
    ("specmeter_markers", "markers", "Batch markers received."),
    ("specmeter_partials_emitted", "partials_emitted", "Per-partition partial aggregates emitted."),
    ("specmeter_batches_published", "batches_published", "BatchMetrics messages published (all revisions)."),
    ("specmeter_batches_expired", "batches_expired", "Batches forgotten after their grace period."),
)

_PUBLISHED_COUNTERS = tuple(
    name
    for stem, _, _ in PUBLISHED_QUANTITIES
    for name in (f"specmeter_{stem}_total", f"specmeter_{stem}_retracted_total")
)

EXPORTED_METRICS = (
    *_PUBLISHED_COUNTERS,
    *_BATCH_GAUGES,
    *_BATCH_FIELDS,
    *_VERSION_GAUGES,
    "specmeter_batch_acceptance_length_steps",
    "specmeter_batch_info",
    *(f"{name}_total" for name, _, _ in _WORKER_COUNTERS),
    "specmeter_offset_gap_fills_total",
    "specmeter_idle_catch_ups_total",
    "specmeter_dead_letters_total",
    "specmeter_batches_closed_total",
    "specmeter_open_generations",
    "specmeter_partition_last_event_timestamp_seconds",
    "specmeter_batch_close_latency_seconds",
)


def version_label(weight_version: str | None, named: set[str | None]) -> str:
    """The weight_version label: the version, or ``unknown`` for null (``unknown (null)``
    in the odd batch where a producer named a version "unknown" too)."""
    if weight_version is not None:
        return weight_version
    return UNKNOWN_VERSION if UNKNOWN_VERSION not in named else f"{UNKNOWN_VERSION} (null)"


class WorkerCollector:
    """A prometheus_client collector reading the shell at scrape time."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def collect(self) -> Iterator[Any]:
        yield from self._worker(self.shell)
        published: PublishedTotals | None = getattr(self.shell, "published", None)
        if published is not None:
            yield from self._published(published)
            yield from self._latest(list(published.latest.values()))

    @staticmethod
    def _worker(shell: Any) -> Iterator[Any]:
        c = shell.counters
        for name, attribute, doc in _WORKER_COUNTERS:
            yield CounterMetricFamily(name, doc, value=getattr(c, attribute))
        yield CounterMetricFamily(
            "specmeter_offset_gap_fills",
            "Times offsets skipped by the consumer were read directly to keep the state exact.",
            value=shell.gap_fills,
        )
        yield CounterMetricFamily(
            "specmeter_idle_catch_ups",
            "Times a partition with unread messages and no delivery was read directly.",
            value=shell.idle_catch_ups,
        )
        dead = CounterMetricFamily("specmeter_dead_letters", "Dead letters by reason.", labels=["reason"])
        for reason, n in sorted(c.dead_letters.items()):
            dead.add_metric([reason], n)
        yield dead
        closed = CounterMetricFamily(
            "specmeter_batches_closed", "Batch partitions closed, by reason.", labels=["reason"]
        )
        for reason, n in sorted(c.batches_closed.items()):
            closed.add_metric([reason], n)
        yield closed
        yield GaugeMetricFamily(
            "specmeter_open_generations",
            "Distinct generations held in dedup state.",
            value=sum(p.open_generations for p in shell.processors.values()),
        )
        last = GaugeMetricFamily(
            "specmeter_partition_last_event_timestamp_seconds",
            "When each owned records partition last delivered a message (Unix seconds; the "
            "worker's start if none yet). time() minus it is how long the partition is idle.",
            labels=["partition"],
        )
        for partition in sorted(shell.processors):
            last.add_metric([str(partition)], shell.last_event_at.get(partition, shell.started_at))
        yield last
        latency = HistogramMetricFamily(
            "specmeter_batch_close_latency_seconds", "From a batch's close on its partitions to its publication."
        )
        buckets = [(str(b), n) for b, n in zip(CLOSE_LATENCY_BUCKETS, c.close_latency_buckets, strict=True)]
        latency.add_metric([], [*buckets, ("+Inf", c.close_latency_count)], c.close_latency_sum)
        yield latency

    @staticmethod
    def _published(published: PublishedTotals) -> Iterator[Any]:
        for i, (stem, _, doc) in enumerate(PUBLISHED_QUANTITIES):
            added = CounterMetricFamily(
                f"specmeter_{stem}",
                f"{doc} Sum over the revisions this worker published "
                "(each adds its difference from the batch's previous one).",
                labels=["algorithm", "run_id"],
            )
            retracted = CounterMetricFamily(
                f"specmeter_{stem}_retracted",
                f"What later revisions took back from specmeter_{stem}_total (subtract it).",
                labels=["algorithm", "run_id"],
            )
            for labels, totals in published.totals.items():
                added.add_metric(list(labels), totals.added[i] if totals.scraped else 0)
                retracted.add_metric(list(labels), totals.retracted[i] if totals.scraped else 0)
            yield added
            yield retracted
        for totals in published.totals.values():
            totals.scraped = True

    @staticmethod
    def _latest(latest: list[Any]) -> Iterator[Any]:
        batch = ["run_id", "batch_id", "algorithm"]
        families = {name: GaugeMetricFamily(name, doc, labels=batch) for name, (_, doc) in _BATCH_GAUGES.items()}
        fields = {name: GaugeMetricFamily(name, doc, labels=batch) for name, (_, doc) in _BATCH_FIELDS.items()}
        versions = {
            name: GaugeMetricFamily(name, doc, labels=[*batch, "weight_version"])
            for name, (_, doc) in _VERSION_GAUGES.items()
        }
        steps = GaugeMetricFamily(
            "specmeter_batch_acceptance_length_steps",
            "Verify steps of a latest batch that accepted N drafts.",
            labels=[*batch, "accepted"],
        )
        info = InfoMetricFamily("specmeter_batch", "Identity of a latest published batch.", labels=batch)
        for m in latest:
            algorithm, run_id = published_labels(m)
            ids = [run_id, m.batch_id, algorithm]
            for name, (key, _) in _BATCH_GAUGES.items():
                value = m.metrics.get(key)
                if value is not None:
                    families[name].add_metric(ids, value)
            for name, (attribute, _) in _BATCH_FIELDS.items():
                fields[name].add_metric(ids, float(getattr(m, attribute)))
            for accepted, n in enumerate(m.accept_histogram or ()):
                steps.add_metric([*ids, str(accepted)], n)
            info.add_metric(ids, {"close_reason": m.close_reason})
            entries = m.by_weight_version or ()
            named = {e.weight_version for e in entries}
            for entry in entries:
                labels = [*ids, version_label(entry.weight_version, named)]
                for name, (key, _) in _VERSION_GAUGES.items():
                    value = entry.metrics.get(key)
                    if value is not None:
                        versions[name].add_metric(labels, value)
        yield from families.values()
        yield from fields.values()
        yield from versions.values()
        yield steps
        yield info


def registry_for(shell: Any) -> CollectorRegistry:
    """The worker's registry: its own collector plus the standard process and Python ones."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(shell))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def render(shell: Any) -> bytes:
    """The text exposition format of one scrape."""
    return generate_latest(registry_for(shell))
