"""The worker's Prometheus exposition, built at scrape time from its own state.

Naming follows Prometheus conventions: ``specmeter_`` prefix, ``_total`` for
counters, base units (seconds, ratios, tokens, steps). No label's set of values
grows with the run: no batch, session, generation or weight-version name is ever a
label (per-batch values are on the metrics topic), and task names, which producers
choose, are bounded per pair; the series a worker exports do not multiply as it
publishes batches. Three kinds of series:

* **Counters of published batches** (``specmeter_paired_accepted_tokens_total`` …,
  labels ``algorithm`` and ``run_id``; acceptance by draft position adds
  ``position`` = 1..``MAX_EXPORTED_POSITION`` (16), paired tokens by policy staleness
  add ``version_age`` = 0..3, 4+, unknown, paired sums by task add ``task``: the first
  ``PublishedTotals.max_tasks`` task names of a pair, ``(other)`` past them,
  ``(unknown)``; paired sums by draft lag add ``draft_lag`` = 0..7, 8+, unknown, and the
  spread of the generations' tokens per verify step is the histogram
  ``specmeter_generation_tokens_per_verify`` over its exact quarter-token buckets, ``le``
  = 1.25 .. 16.75, +Inf; revision 5): every BatchMetrics revision this worker
  published adds its difference from the batch's previous revision, so sums and
  rates add up across batches, revisions and workers. What a revision takes back
  (a late record that turns a key conflicting) goes to the ``_retracted_total``
  twin; the exact value is ``total - retracted``::

      (sum(rate(specmeter_paired_accepted_tokens_total[5m]))
         - sum(rate(specmeter_paired_accepted_tokens_retracted_total[5m])))
      / (sum(rate(specmeter_paired_proposed_tokens_total[5m]))
         - sum(rate(specmeter_paired_proposed_tokens_retracted_total[5m])))

  is the fleet-wide weighted accept rate, and the same with
  ``specmeter_position_accepted_steps_total{position="k"}`` over
  ``specmeter_position_verify_steps_total`` the fleet's acceptance at draft position k.
  Every scrape shows the totals as they are: a scrape changes nothing (a series that
  once showed 0 to whichever scrape came first let a ``curl`` take Prometheus' first
  sample, issue 33). At most ``PublishedTotals.max_label_sets`` (16) (algorithm,
  run_id) pairs are exported.
* **The newest batch** of each (run_id, algorithm) this worker published
  (``specmeter_batch_*``; by version age ``specmeter_weight_version_*``), for the
  ``PublishedTotals.latest_label_sets`` (4) most recently published pairs: the batch
  that closed last, at its newest revision. With several workers, the fleet's newest
  is the one with the greatest ``specmeter_batch_closed_timestamp_seconds``.
* **The worker itself**: its stage counters, dead letters by reason, the close
  latency histogram, per owned partition the last event (a timestamp) and the
  applied offset, its readiness, how long its writes have stalled, the Kafka
  endpoints it cannot reach now and its outages, and the standard ``process_*`` /
  ``python_*`` collectors.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily

from ..core.counts import CLOSE_LATENCY_BUCKETS, WorkerCounters
from ..core.merge import accept_rate_by_position
from .counters import (
    MAX_EXPORTED_POSITION,
    MORE_COUNTERS,
    PUBLISHED_QUANTITIES,
    SLOTS,
    SPREAD_BOUNDS,
    SPREAD_STEM,
    TASK_COUNTERS,
    VERSION_AGES,
    LabelTotals,
    PublishedTotals,
    published_labels,
    version_ages,
)

__all__ = ["WorkerCollector", "render", "CLOSE_LATENCY_BUCKETS", "EXPORTED_METRICS", "LATEST_LABELS"]

#: the labels of every latest-batch gauge (a gauge split further adds its own after them)
LATEST_LABELS = ["run_id", "algorithm"]

#: latest-batch gauge -> (key of BatchMetrics.metrics, help)
_BATCH_GAUGES = {
    "specmeter_batch_accept_rate_ratio": (
        "spec/accept_rate",
        "Accepted / proposed draft tokens (paired) of the newest batch.",
    ),
    "specmeter_batch_tokens_per_verify": (
        "spec/tokens_per_verify",
        "Completion tokens per verify step (paired) of the newest batch.",
    ),
    "specmeter_batch_accept_coverage_ratio": (
        "spec/accept_count_coverage",
        "Share of generations with both accepted and proposed known.",
    ),
    "specmeter_batch_verify_coverage_ratio": (
        "spec/verify_count_coverage",
        "Share of generations with both completion and verify known.",
    ),
    "specmeter_batch_generations": ("spec/unique_generation_count", "Distinct generations of the newest batch."),
    "specmeter_batch_conflicting_generations": (
        "spec/conflicting_generation_count",
        "Generations reported with different values.",
    ),
    "specmeter_batch_samples": ("spec/sample_count", "Samples (trajectories) of the newest batch."),
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
    "specmeter_batch_records": ("record_count", "Records delivered for the newest batch (all deliveries)."),
    "specmeter_batch_invalid_records": ("invalid_record_count", "Invalid records of the newest batch."),
    "specmeter_batch_missing_records": ("missing_record_count", "Records markers counted that never arrived."),
    "specmeter_batch_late_records": ("late_record_count", "Late records of the newest batch."),
    "specmeter_batch_revision": ("revision", "Revision of the newest batch's newest publication."),
    "specmeter_batch_complete": ("complete", "1 when the newest batch is complete."),
    "specmeter_batch_closed_timestamp_seconds": (
        "closed_at",
        "When the newest batch closed (Unix seconds); the greatest across workers is the fleet's newest.",
    ),
}

#: per-version-age gauge of the newest batch -> (key of the age's summed metrics, help): the
#: entries of by_weight_version whose versions share an age (only ``4+`` can hold several)
#: are summed and their ratios taken from the sums
_VERSION_GAUGES = {
    "specmeter_weight_version_accept_rate_ratio": (
        "spec/accept_rate",
        "Accepted / proposed draft tokens (paired) of one version age in the newest batch.",
    ),
    "specmeter_weight_version_tokens_per_verify": (
        "spec/tokens_per_verify",
        "Completion tokens per verify step (paired) of one version age in the newest batch.",
    ),
    "specmeter_weight_version_accept_coverage_ratio": (
        "spec/accept_count_coverage",
        "Share of one version age's generations with both accepted and proposed known.",
    ),
    "specmeter_weight_version_generations": (
        "spec/unique_generation_count",
        "Distinct generations of one version age in the newest batch.",
    ),
    "specmeter_weight_version_paired_accepted_tokens": (
        "spec/paired_accepted_total",
        "Accepted draft tokens (paired) of one version age in the newest batch.",
    ),
    "specmeter_weight_version_paired_proposed_tokens": (
        "spec/paired_proposed_total",
        "Proposed draft tokens (paired) of one version age in the newest batch.",
    ),
    "specmeter_weight_version_paired_completion_tokens": (
        "spec/paired_completion_total",
        "Completion tokens (paired) of one version age in the newest batch.",
    ),
    "specmeter_weight_version_paired_verify_steps": (
        "spec/paired_verify_total",
        "Verify steps (paired) of one version age in the newest batch.",
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

#: every counter family of published batches: stem -> (help, the extra label or None)
_COUNTER_FAMILIES: dict[str, tuple[str, str | None]] = {
    **{stem: (doc, None) for stem, _, doc in PUBLISHED_QUANTITIES},
    **{stem: (doc, label) for stem, doc, label in MORE_COUNTERS},
    **{stem: (doc, "task") for stem, _, doc in TASK_COUNTERS},
}

_PUBLISHED_COUNTERS = tuple(
    name for stem in _COUNTER_FAMILIES for name in (f"specmeter_{stem}_total", f"specmeter_{stem}_retracted_total")
)

#: gauges of the newest batch split by draft position, acceptance length or version age
_SPLIT_GAUGES = (
    "specmeter_batch_position_accept_rate_ratio",
    "specmeter_batch_acceptance_length_steps",
    "specmeter_weight_version_position_accept_rate_ratio",
)

#: (revision 5) the spread of tokens per verify step, a histogram, and its retracted twin
_SPREAD_HISTOGRAMS = (f"specmeter_{SPREAD_STEM}", f"specmeter_{SPREAD_STEM}_retracted")
#: the slot of the spread's first bucket (``SLOTS``: its buckets follow it, in ``SPREAD_BOUNDS``' order)
_SPREAD_FIRST = SLOTS.index(next(slot for slot in SLOTS if slot.stem == SPREAD_STEM))

EXPORTED_METRICS = (
    *_PUBLISHED_COUNTERS,
    *_SPREAD_HISTOGRAMS,
    *_BATCH_GAUGES,
    *_BATCH_FIELDS,
    *_VERSION_GAUGES,
    *_SPLIT_GAUGES,
    "specmeter_batch_info",
    *(f"{name}_total" for name, _, _ in _WORKER_COUNTERS),
    "specmeter_input_offsets_missing_total",
    "specmeter_dead_letters_total",
    "specmeter_batch_partitions_closed_total",
    "specmeter_ready",
    "specmeter_output_stalled_seconds",
    "specmeter_kafka_unreachable_endpoints",
    "specmeter_kafka_outages_total",
    "specmeter_open_generations",
    "specmeter_partition_last_event_timestamp_seconds",
    "specmeter_partition_applied_offset",
    "specmeter_batch_close_latency_seconds",
)

#: the sums a version age's gauges are computed from (keys of WeightVersionMetrics.metrics)
_AGE_SUMS = (
    "spec/unique_generation_count",
    "spec/paired_accepted_total",
    "spec/paired_proposed_total",
    "spec/paired_completion_total",
    "spec/paired_verify_total",
    "spec/accept_covered_count",
)


def _age_metrics(entries: list[Any]) -> tuple[dict[str, float], list[float] | None]:
    """The metrics and acceptance by position of the by_weight_version entries of one
    version age: sums added, ratios taken from the sums (for one entry: its own values)."""
    sums = {key: sum(e.metrics.get(key, 0) for e in entries) for key in _AGE_SUMS}
    out: dict[str, float] = dict(sums) | _age_ratios(sums)
    if len(entries) == 1:
        return out, entries[0].accept_rate_by_position
    return out, _positions_of_summed(entries)


#: the ratios of a version age, from its sums: (key, numerator, denominator)
_AGE_RATIOS = (
    ("spec/accept_rate", "spec/paired_accepted_total", "spec/paired_proposed_total"),
    ("spec/tokens_per_verify", "spec/paired_completion_total", "spec/paired_verify_total"),
    ("spec/accept_count_coverage", "spec/accept_covered_count", "spec/unique_generation_count"),
)


def _age_ratios(sums: dict[str, int]) -> dict[str, float]:
    """The ratios of a version age, from its sums (none whose denominator is 0)."""
    out: dict[str, float] = {}
    for ratio, numerator, denominator in _AGE_RATIOS:
        if sums[denominator] > 0:
            out[ratio] = sums[numerator] / sums[denominator]
    return out


def _positions_of_summed(entries: list[Any]) -> list[float] | None:
    """Acceptance by position of the entries' histograms, summed (None: no histogram)."""
    histograms = [e.accept_histogram for e in entries if e.accept_histogram is not None]
    if not histograms:
        return None
    return accept_rate_by_position(_summed(histograms))


def _summed(histograms: list[Any]) -> list[int]:
    """Histograms added up bin by bin (a shorter one has nothing past its end)."""
    width = max(map(len, histograms))
    return [sum(h[i] for h in histograms if i < len(h)) for i in range(width)]


def _kafka(shell: Any) -> Iterator[Any]:
    """Readiness and what the worker sees of Kafka (for a shell that has them): the
    outages go here and to the log, not to readiness (``readiness``)."""
    outages, output = getattr(shell, "outages", None), getattr(shell, "output", None)
    if outages is None or output is None:
        return
    yield GaugeMetricFamily(
        "specmeter_ready",
        "1 while /specmeter/readyz answers ready: the worker serves its partitions and can write.",
        value=float(shell.readiness().ready),
    )
    yield GaugeMetricFamily(
        "specmeter_output_stalled_seconds",
        "How long the worker's writes have waited with none acknowledged (0: none waits); readiness drops "
        "at --ready-write-timeout.",
        value=output.stalled_s(time.monotonic()),
    )
    yield GaugeMetricFamily(
        "specmeter_kafka_unreachable_endpoints",
        "Kafka endpoints the worker cannot use now: brokers it cannot reach, the group coordinator, and the "
        "cluster while it refuses writes.",
        value=len(outages.unreachable),
    )
    yield CounterMetricFamily(
        "specmeter_kafka_outages",
        "Outages of a broker or the group coordinator the worker said in its log since it started.",
        value=outages.outages_total,
    )


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
            "specmeter_input_offsets_missing",
            "Input offsets after a checkpoint the log no longer held when read (retention, compaction): "
            "records lost before any worker read them.",
            value=shell.input_offsets_missing,
        )
        yield _by_reason("specmeter_dead_letters", "Dead letters by reason.", c.dead_letters)
        yield _by_reason(
            "specmeter_batch_partitions_closed",
            "Batches closed on one records partition, by reason: a batch with input on 4 partitions counts 4 "
            "(specmeter_batches_total counts batches).",
            c.batch_partitions_closed,
        )
        yield from _kafka(shell)
        yield GaugeMetricFamily(
            "specmeter_open_generations",
            "Distinct generations held in dedup state.",
            value=sum(p.open_generations for p in shell.processors.values()),
        )
        yield from _partitions(shell)
        yield _close_latency(c)

    @staticmethod
    def _published(published: PublishedTotals) -> Iterator[Any]:
        families = _published_families()
        for labels, totals in published.totals.items():  # slots and tasks: families of their own
            _add_slots(families, labels, totals)
            _add_tasks(families, labels, totals)
        for added, retracted in families.values():
            yield added
            yield retracted
        yield from _spread(published)

    @staticmethod
    def _latest(latest: list[Any]) -> Iterator[Any]:
        gauges = _Latest()
        for m in latest:
            gauges.add(m)
        yield from gauges.families()


def _by_reason(name: str, doc: str, counts: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["reason"])
    for reason, n in sorted(counts.items()):
        family.add_metric([reason], n)
    return family


def _partitions(shell: Any) -> Iterator[Any]:
    """Per owned records partition: when it last delivered, and its last applied offset."""
    last = GaugeMetricFamily(
        "specmeter_partition_last_event_timestamp_seconds",
        "When each owned records partition last delivered a message (Unix seconds; the "
        "worker's start if none yet). time() minus it is how long the partition is idle.",
        labels=["partition"],
    )
    applied = GaugeMetricFamily(
        "specmeter_partition_applied_offset",
        "The last records-topic offset stage 1 applied, per owned partition (-1: none yet). Its "
        "rate is the partition's progress; the log end minus 1 minus it is the partition's lag.",
        labels=["partition"],
    )
    for partition, processor in sorted(shell.processors.items()):
        last.add_metric([str(partition)], shell.last_event_at.get(partition, shell.started_at))
        applied.add_metric([str(partition)], processor.checkpoint)
    yield last
    yield applied


def _published_families() -> dict[str, tuple[CounterMetricFamily, CounterMetricFamily]]:
    """Each counter family of published batches and its ``_retracted`` twin, empty."""
    families: dict[str, tuple[CounterMetricFamily, CounterMetricFamily]] = {}
    for stem, (doc, label) in _COUNTER_FAMILIES.items():
        names = ["algorithm", "run_id", *([label] if label else [])]
        families[stem] = (
            CounterMetricFamily(
                f"specmeter_{stem}",
                f"{doc} Sum over the revisions this worker published "
                "(each adds its difference from the batch's previous one).",
                labels=names,
            ),
            CounterMetricFamily(
                f"specmeter_{stem}_retracted",
                f"What later revisions took back from specmeter_{stem}_total (subtract it).",
                labels=names,
            ),
        )
    return families


def _add_slots(
    families: dict[str, tuple[CounterMetricFamily, CounterMetricFamily]], labels: tuple, totals: LabelTotals
) -> None:
    """One (algorithm, run_id)'s totals of every slot it has (a slot: a family, and its extra label's value)."""
    for i in sorted(totals.present):
        slot = SLOTS[i]
        if slot.stem == SPREAD_STEM:  # a histogram's bucket (``_spread``)
            continue
        added, retracted = families[slot.stem]
        values = [*labels, *([slot.value] if slot.value is not None else [])]
        added.add_metric(values, totals.added[i])
        retracted.add_metric(values, totals.retracted[i])


def _close_latency(c: WorkerCounters) -> HistogramMetricFamily:
    """The histogram of close latencies the worker's counters keep (``CLOSE_LATENCY_BUCKETS``)."""
    latency = HistogramMetricFamily(
        "specmeter_batch_close_latency_seconds", "From a batch's close on its partitions to its publication."
    )
    buckets = [(str(b), n) for b, n in zip(CLOSE_LATENCY_BUCKETS, c.close_latency_buckets, strict=True)]
    latency.add_metric([], [*buckets, ("+Inf", c.close_latency_count)], c.close_latency_sum)
    return latency


def _spread(published: PublishedTotals) -> Iterator[HistogramMetricFamily]:
    """The spread of tokens per verify step (docs/contract.md §3.7) of each (algorithm,
    run_id) whose batches had one, as a histogram of what revisions added and its
    ``_retracted`` twin: cumulative over the quarter-token buckets, ``le`` their upper
    edges. No ``_sum`` (a generation's own ratio is not kept, only its bucket), so no
    ``_count`` either: the ``+Inf`` bucket counts the generations."""
    added, retracted = _spread_families()
    for labels, totals in published.totals.items():
        if _SPREAD_FIRST not in totals.present:
            continue
        for family, counts in ((added, totals.added), (retracted, totals.retracted)):
            family.add_metric(list(labels), _spread_buckets(counts), None)
    yield added
    yield retracted


def _spread_buckets(counts: list[int]) -> list[tuple[str, int]]:
    """A label set's spread buckets (its slots' counts, each bucket apart) as the histogram
    has them: cumulative, each under its ``le``."""
    cumulative = itertools.accumulate(counts[_SPREAD_FIRST : _SPREAD_FIRST + len(SPREAD_BOUNDS)])
    return list(zip(SPREAD_BOUNDS, cumulative, strict=True))


def _spread_families() -> tuple[HistogramMetricFamily, HistogramMetricFamily]:
    """The spread's two histograms (what revisions added, what later ones took back),
    described and labelled, with no sample yet."""
    names = ["algorithm", "run_id"]
    added = HistogramMetricFamily(
        _SPREAD_HISTOGRAMS[0],
        "Generations with completion and verify known and verify > 0, by their own tokens per verify step, "
        "in exact quarter-token buckets (le = 1.25 .. 16.75, +Inf; a bucket counts those below its le, one "
        "exactly at an edge counts in the next). Sum over the revisions this worker published.",
        labels=names,
    )
    retracted = HistogramMetricFamily(
        _SPREAD_HISTOGRAMS[1],
        f"What later revisions took back from {_SPREAD_HISTOGRAMS[0]} (subtract its buckets).",
        labels=names,
    )
    return added, retracted


def _add_tasks(
    families: dict[str, tuple[CounterMetricFamily, CounterMetricFamily]], labels: tuple, totals: LabelTotals
) -> None:
    """One (algorithm, run_id)'s totals of each task it exports."""
    for task in sorted(totals.task_added):
        for i, (stem, _, _) in enumerate(TASK_COUNTERS):
            added, retracted = families[stem]
            added.add_metric([*labels, task], totals.task_added[task][i])
            retracted.add_metric([*labels, task], totals.task_retracted[task][i])


class _Latest:
    """The gauges of each (run, algorithm)'s newest batch, filled a batch at a time."""

    def __init__(self) -> None:
        batch = LATEST_LABELS
        self.gauges = _gauge_families(_BATCH_GAUGES, batch)
        self.fields = _gauge_families(_BATCH_FIELDS, batch)
        self.versions = _gauge_families(_VERSION_GAUGES, [*batch, "version_age"])
        self.positions = GaugeMetricFamily(
            "specmeter_batch_position_accept_rate_ratio",
            "Share of the newest batch's verify steps (with a histogram) that accepted their k-th draft "
            f"(accept_rate_by_position), by position k = 1..{MAX_EXPORTED_POSITION}; higher positions are not "
            "exported (the metrics topic has them).",
            labels=[*batch, "position"],
        )
        self.version_positions = GaugeMetricFamily(
            "specmeter_weight_version_position_accept_rate_ratio",
            "specmeter_batch_position_accept_rate_ratio of one version age in the newest batch.",
            labels=[*batch, "version_age", "position"],
        )
        self.steps = GaugeMetricFamily(
            "specmeter_batch_acceptance_length_steps",
            f"Verify steps of the newest batch that accepted N drafts (N = {MAX_EXPORTED_POSITION}: "
            f"{MAX_EXPORTED_POSITION} or more).",
            labels=[*batch, "accepted"],
        )
        self.info = InfoMetricFamily("specmeter_batch", "How the newest batch closed.", labels=batch)

    def families(self) -> Iterator[Any]:
        yield from self.gauges.values()
        yield from self.fields.values()
        yield from self.versions.values()
        yield self.positions
        yield self.version_positions
        yield self.steps
        yield self.info

    def add(self, m: Any) -> None:
        algorithm, run = published_labels(m)
        ids = [run, algorithm]
        self._gauges(m, ids)
        for name, (attribute, _) in _BATCH_FIELDS.items():
            self.fields[name].add_metric(ids, float(getattr(m, attribute)))
        self._steps(m.accept_histogram or [], ids)
        _add_positions(self.positions, ids, m.accept_rate_by_position)
        self.info.add_metric(ids, {"close_reason": m.close_reason})
        self._versions(m, ids)

    def _gauges(self, m: Any, ids: list[str]) -> None:
        """The batch's gauges of the metrics it has."""
        _add_known(self.gauges, _BATCH_GAUGES, m.metrics, ids)

    def _steps(self, histogram: list[int], ids: list[str]) -> None:
        """The acceptance-length gauge: bins past the last exported one folded into it."""
        for accepted, n in enumerate(histogram[:MAX_EXPORTED_POSITION]):
            self.steps.add_metric([*ids, str(accepted)], n)
        if len(histogram) > MAX_EXPORTED_POSITION:
            self.steps.add_metric([*ids, str(MAX_EXPORTED_POSITION)], sum(histogram[MAX_EXPORTED_POSITION:]))

    def _versions(self, m: Any, ids: list[str]) -> None:
        """The gauges of each version age present in the batch's ``by_weight_version``."""
        by_age = _by_age(m)
        for age in (age for age in VERSION_AGES if age in by_age):
            self._version(by_age[age], [*ids, age])

    def _version(self, entries: list[Any], ids: list[str]) -> None:
        """The gauges of one version age (``ids`` ending with it)."""
        metrics, rates = _age_metrics(entries)
        _add_known(self.versions, _VERSION_GAUGES, metrics, ids)
        _add_positions(self.version_positions, ids, rates)


def _gauge_families(table: dict[str, tuple[str, str]], labels: list[str]) -> dict[str, GaugeMetricFamily]:
    """A gauge family, empty, for each gauge of ``table`` (name -> (source, help)), labelled ``labels``."""
    return {name: GaugeMetricFamily(name, doc, labels=labels) for name, (_, doc) in table.items()}


def _add_known(
    families: dict[str, GaugeMetricFamily], table: dict[str, tuple[str, str]], metrics: dict, ids: list[str]
) -> None:
    """Each gauge of ``table`` (name -> (key of ``metrics``, help)) whose metric is known, under ``ids``."""
    for name, (key, _) in table.items():
        value = metrics.get(key)
        if value is not None:
            families[name].add_metric(ids, value)


def _by_age(m: Any) -> dict[str, list[Any]]:
    """A batch's ``by_weight_version`` entries by version age."""
    ages = version_ages(m)
    by_age: dict[str, list[Any]] = {}
    for entry in m.by_weight_version or ():
        by_age.setdefault(ages[entry.weight_version], []).append(entry)
    return by_age


def _add_positions(family: Any, ids: list[str], rates: list[float] | None) -> None:
    """Acceptance by position k = 1..MAX_EXPORTED_POSITION, under ``ids`` and k."""
    for k, rate in enumerate((rates or [])[:MAX_EXPORTED_POSITION], start=1):
        family.add_metric([*ids, str(k)], rate)


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
